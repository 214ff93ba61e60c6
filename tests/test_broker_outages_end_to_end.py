"""Brokers that go away while the simulator publishes and the stream worker and the sink run: one node of a 3-node
KRaft cluster killed (kill -9), and a single broker stopped and restarted. Every sample is stored once, and an XID sent
after the disruption still becomes one fault."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from agents.simulator.simulate import simulate
from core.settings import CommonSettings, load
from fleetpulse.broker import LocalKafka, LocalKafkaCluster
from fleetpulse.local_process import listening
from schemas.provision import ensure_topics
from schemas.topics import SAMPLES, XID
from core.clickhouse import connect
from tests.conftest import free_ports
from tests.pipeline import worker_and_sink
from tests.streams.broker import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path):
    kafka = LocalKafkaCluster(tmp_path / "cluster", nodes=3, port=free_ports(6))
    try:
        kafka.start(timeout=240)
        yield kafka
    finally:
        kafka.stop(timeout=20)


@pytest.fixture
def cluster_env(cluster, settings_env, monkeypatch):
    """The test's namespace and database (settings_env), on the cluster instead of the session's broker."""
    monkeypatch.setenv("FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS", cluster.bootstrap)
    monkeypatch.setenv("FLEETPULSE_KAFKA_REPLICATION", "3")


async def counted_run(tmp_path, disrupt) -> None:
    """Simulator (4 hosts, 40 s at wall-clock pace), worker (fault_bins) and sink; `disrupt()` 12 s in; then an XID.
    Every GPU sample must be stored exactly once and the XID stored as one fault."""
    settings = load(CommonSettings)
    log = tmp_path / "streams.log"
    async with worker_and_sink(log, stages="fault_bins") as sink:
        publishing = asyncio.create_task(simulate(settings, hosts=4, duration=40, seed=5, speed=1,
                                                  start_ts=time.time() - 60, nccl_interval=0))
        await asyncio.sleep(12)
        await disrupt()
        report = await asyncio.wait_for(publishing, 180)
        xid = {"host": "gpu-node-0002", "ts": time.time() - 5, "code": 79, "gpu_index": 1, "message": "off the bus"}
        producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
        await producer.start()
        try:
            await producer.send_and_wait(XID.full(settings.topic_prefix), orjson.dumps(xid), key=b"gpu-node-0002")
        finally:
            await producer.stop()

        db = connect(sink.settings, "owner")

        def count(sql: str):
            return db.query(sql).result_rows[0]

        async def landed() -> bool:
            return (count("SELECT count() FROM gpu_samples")[0] >= report.gpu_readings
                    and count("SELECT count() FROM faults WHERE code = 'xid:79'")[0] >= 1)
        try:
            await wait_for("every sample stored and the XID's fault", landed, 180, log)
        except AssertionError as exc:  # say how far it got
            raise AssertionError(f"stored {count('SELECT count() FROM gpu_samples')[0]} of {report.gpu_readings} GPU "
                                 f"samples, {count('SELECT count() FROM faults')[0]} faults; {exc}") from None
    assert report.sent[SAMPLES.name] == 4 * 40
    assert count("SELECT count(), uniqExact(host, gpu_index, ts) FROM gpu_samples") == \
        (report.gpu_readings, report.gpu_readings)
    assert count("SELECT count(), uniqExact(fault_id) FROM faults WHERE code = 'xid:79'") == (1, 1)


async def test_a_broker_killed_mid_run_loses_and_doubles_nothing(cluster, cluster_env, tmp_path):
    settings = load(CommonSettings)
    assert settings.replication == 3
    await ensure_topics(settings.kafka_client_args(), settings.topic_prefix, settings.replication)
    admin = AIOKafkaAdminClient(**settings.kafka_client_args())
    await admin.start()
    try:  # a node learns of a new topic's partitions a moment after the controller: ask until it has them
        for _ in range(60):
            [described] = await admin.describe_topics([SAMPLES.full(settings.topic_prefix)])
            if len(described["partitions"]) == SAMPLES.partitions:
                break
            await asyncio.sleep(0.5)
        assert [len(p["replicas"]) for p in described["partitions"]] == [3] * SAMPLES.partitions
    finally:
        await admin.close()
    victim = cluster.nodes[0]  # the first bootstrap address, and a controller voter

    async def kill() -> None:
        assert victim.kill() is not None and not listening(victim.port)

    await counted_run(tmp_path, kill)
    assert victim._running_pid() is None  # the rest of the run went through the two survivors


async def test_the_only_broker_stopped_and_restarted_mid_run_loses_and_doubles_nothing(settings_env, tmp_path,
                                                                                      monkeypatch):
    base = free_ports(2)
    broker = LocalKafka(tmp_path / "single", port=base, controller_port=base + 1)  # its own: the session's stays up
    monkeypatch.setenv("FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS", await asyncio.to_thread(broker.start))

    async def restart() -> None:  # a planned restart: down for ~10 s, every record on its disk kept
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(8)
        await asyncio.to_thread(broker.start)

    try:
        await counted_run(tmp_path, restart)
    finally:
        await asyncio.to_thread(broker.stop)
