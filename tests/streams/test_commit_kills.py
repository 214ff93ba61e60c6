"""The commit protocol (streams/runtime/commit.py) in its order, and the worker killed after each of its steps on the
real broker: nothing lost (every alert out, every record's state kept, every offset committed in the end), nothing
doubled (a record's state counted once; once the state is durable, no output sent again)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from schemas.codec import encode
from schemas.provision import ensure_topics
from schemas.topics import ALERTS, SAMPLES
from streams.groups import group_id
from streams.runtime import commit
from tests.conftest import REPO, free_ports
from tests.streams.helpers import gpu, sample
from tests.streams.broker import group_is_empty
from tests.streams.test_toy_stage import installed
from tests.streams.broker import read_all, stop_worker, wait_for

STEPS = ("outputs_acknowledged", "changelog_sent", "changelog_acknowledged", "records_acknowledged")
HOSTS = [f"h{k:02d}" for k in range(12)]


async def test_commit_runs_its_steps_in_order_and_stops_at_the_first_that_fails(monkeypatch):
    done: list[str] = []

    def recorder(name: str, fail: bool = False):
        async def step(*args):
            done.append(name)
            if fail:
                raise RuntimeError(name)
            return []
        return step

    class Batch:
        pending: list = []
        rolled_back = False

        def flush(self):
            done.append("flush")
            return []

        def roll_back(self):
            self.rolled_back = True

    for name in STEPS[:3]:
        monkeypatch.setattr(commit, name, recorder(name))
    monkeypatch.setattr(commit, "records_acknowledged", lambda ack: done.append("records_acknowledged"))
    await commit.commit(Batch(), None, lambda: None)
    assert done == ["outputs_acknowledged", "flush", *STEPS[1:]]
    done.clear()
    monkeypatch.setattr(commit, "outputs_acknowledged", recorder("outputs_acknowledged", fail=True))
    batch = Batch()
    with pytest.raises(RuntimeError):
        await commit.commit(batch, None, lambda: None)
    assert done == ["outputs_acknowledged"] and batch.rolled_back  # nothing written, the state as it was


def worker(path: str, log, port: int, kill_after: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": path, "FLEETPULSE_TOY": '{"hot_c": 80}',
           "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2", "FLEETPULSE_STREAMS_SESSION_TIMEOUT_S": "6",
           "FLEETPULSE_STREAMS_METRICS_PORT": str(port), "FLEETPULSE_STREAMS_METRICS_ADDR": "127.0.0.1"}
    cmd = ["-m", "tests.streams.commit_killer", kill_after] if kill_after else ["-m", "fleetpulse.cli"]
    return subprocess.Popen([sys.executable, *cmd, "streams", "--stages", "toy"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


async def committed(bootstrap: str, group: str, tp: TopicPartition) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        meta = (await admin.list_consumer_group_offsets(group)).get(tp)
        return meta.offset if meta is not None else -1
    finally:
        await admin.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
async def test_the_worker_killed_after_each_step_loses_nothing_and_doubles_no_state(
        step, settings_env, kafka_bootstrap, topic_prefix, tmp_path):
    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    samples, alerts = SAMPLES.full(topic_prefix), ALERTS.full(topic_prefix)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:  # one partition: the records are one batch, written (or not) as one
        for host in HOSTS:
            record = sample(host, 1_000.0, [gpu(0, 85.0), gpu(1, 60.0)])
            await producer.send_and_wait(samples, encode(record), key=host.encode(), partition=0)
    finally:
        await producer.stop()
    path, log, port = installed(tmp_path / "site"), tmp_path / "worker.log", free_ports(1)

    async def fired() -> list[dict]:
        return [a for a in (orjson.loads(r.value) for r in await read_all(kafka_bootstrap, alerts, ALERTS.partitions))
                if a["alertname"] == "ToyHotGpu"]

    killed = worker(path, log, port, kill_after=step)
    try:
        assert await asyncio.to_thread(killed.wait, 120) == -signal.SIGKILL, log.read_text()[-3000:]
    except BaseException:
        stop_worker(killed, log, failing=True)
        raise
    before = await fired()
    assert len(before) == len(HOSTS), before  # the kill came after the outputs were acknowledged
    group, tp = group_id(topic_prefix, "telemetry"), TopicPartition(samples, 0)
    assert await committed(kafka_bootstrap, group, tp) < len(HOSTS)  # ... and before the offsets were committed
    await wait_for("the killed member to leave the group", lambda: group_is_empty(kafka_bootstrap, group), 30, log)

    again = worker(path, log, port)
    try:
        async def all_committed():
            return await committed(kafka_bootstrap, group, tp) == len(HOSTS)

        await wait_for("the batch committed", all_committed, 90, log)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        held = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.labels.get("stage") == "toy" and s.name == "fleetpulse_stage_state_entries"}
    except BaseException:
        stop_worker(again, log, failing=True)
        raise
    stop_worker(again, log)
    after = await fired()
    assert sorted({(a["host"], a["gpu_index"]) for a in after}) == [(h, 0) for h in HOSTS]  # nothing lost
    assert held == {"fleetpulse_stage_state_entries": len(HOSTS)}  # each host's state once
    if step in ("outputs_acknowledged", "changelog_sent"):
        # The state was not durable: the batch ran again on the state before it, its alerts sent again with the same
        # fingerprints (for the alert topic's readers to deduplicate), and only its.
        assert len(after) <= 2 * len(HOSTS) and len({a["fingerprint"] for a in after}) == len(HOSTS)
    else:  # the state was durable: the batch read again did nothing twice
        assert len(after) == len(HOSTS), after
