"""Two telemetry workers in one consumer group (how the README says to scale the worker: more processes, a share of the
partitions each), on the real broker.

Phase 1: both take a share; together they take every record of every stage's inputs (per stage, the group gives each
worker some of its input partitions and neither all of them, the `received` counters of both workers add up to at least
the records on its input topics and each is above 0), and the outputs are what one worker makes: each XID one fault, each runaway GPU one firing alert, every host scored.
Phase 2: one worker leaves (SIGTERM), the other takes its partitions and their state from the changelogs: each alert
resolves once (an alert fired by the one that left, resolved by the one that stayed), each new XID one fault, nothing
fired twice.
The one that stays recovers the partitions it takes over; should that recovery stall (faust 0.15.3, about once in 18
handovers), ReRead reads its changelog partitions again after 5 s here and logs their consumer state
(streams/faust_adapter/recovery.py) before the watchdog would stop it at 20 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from fleetpulse.lag import stable_members
from schemas.analytics import Alert
from schemas.codec import encode
from schemas.provision import ensure_topics
from schemas.topics import ALERTS, FAULTS, HEALTH, SAMPLES, XID, Topic
from streams import registry
from streams.groups import app_id, group_id
from tests.agents.test_agent_runner import scrape
from tests.conftest import REPO, free_ports
from tests.streams.helpers import gpu, sample
from tests.streams.broker import produce, read_all, stop_worker, wait_for
from tests.streams.test_worker_integration import PHASE1, PHASE2

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HOSTS = [f"h{h:02d}" for h in range(24)]  # every host's GPU 5 runs away: both workers hold some of them


def start(name: str, tmp: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
           "FLEETPULSE_STREAMS_COMMIT_INTERVAL_S": "0.5", "FLEETPULSE_STREAMS_RECOVERY_STALL_S": "20",
           "FLEETPULSE_STREAMS_RECOVERY_REREAD_S": "5",
           "FLEETPULSE_STREAMS_METRICS_PORT": str(port), "FLEETPULSE_STREAMS_METRICS_ADDR": "127.0.0.1"}
    return subprocess.Popen([sys.executable, "-m", "streams.cli", "--worker", "telemetry", "--workdir",
                             str(tmp / name)], cwd=REPO, env=env, stdout=(tmp / f"{name}.log").open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def counter(port: int, name: str) -> dict[str, float]:
    """A worker's counter `name` per stage, from its /metrics."""
    return {dict(labels)["stage"]: value for (metric, labels), value in scrape(port).items()
            if metric == f"fleetpulse_stage_{name}_total"}


class Logs:
    """Both workers' logs, for wait_for's failure message."""

    def __init__(self, tmp: Path):
        self.tmp = tmp

    def read_text(self) -> str:
        return "".join(f"--- {name}.log:\n{(self.tmp / f'{name}.log').read_text()[-3000:]}\n" for name in "ab")


async def caught_up(bootstrap: str, group: str, topics: set[str]) -> bool:
    """The group has committed every record on `topics`."""
    ends = await records_per_partition(bootstrap, topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return all(committed.get(tp) is not None and committed[tp].offset >= end for tp, end in ends.items() if end)


async def records_per_partition(bootstrap: str, topics: set[str]) -> dict[TopicPartition, int]:
    """End offsets of every partition of `topics`: the records on it (an idempotent producer without transactions
    writes no markers)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - internal topics made after the test began
        tps = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
        return await consumer.end_offsets(tps)
    finally:
        await consumer.stop()


async def records_on(bootstrap: str, topics: set[str]) -> dict[str, int]:
    out = dict.fromkeys(topics, 0)
    for tp, end in (await records_per_partition(bootstrap, topics)).items():
        out[tp.topic] += end
    return out


def expected_received(prefix: str, on: dict[str, int]) -> dict[str, int]:
    """Per telemetry stage: the records on the inputs of each of its steps."""
    out = {}
    for stage in registry.select(None):
        if stage.worker == "telemetry":
            out[stage.name] = sum(on[full(i.topic, prefix)] for step in stage.steps for i in step.inputs)
    return out


def full(topic, prefix: str) -> str:
    return topic.full(prefix) if isinstance(topic, Topic) else topic.full(app_id(prefix))


async def members(bootstrap: str, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await stable_members(admin, group)
    finally:
        await admin.close()


async def assignments(bootstrap: str, group: str) -> list[set[TopicPartition]]:
    """The partitions the group's coordinator gave each member (faust's assignor writes the consumer protocol's
    assignment, its own table standbys in the user data)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return [set(ConsumerProtocolMemberAssignment.decode(m[4]).partitions()) for g in response.groups for m in g[5]]


def runaway(temps: list[float], first: int, t0: float) -> list[tuple[bytes, bytes]]:
    return [(h.encode(), encode(sample(h, t0 + 5 * i + k * 0.01, [gpu(g, t if g == 5 else 60.0) for g in range(8)],
                                       rack=f"r{k % 4}", seq=i)))
            for i, t in enumerate(temps, start=first) for k, h in enumerate(HOSTS)]


def xids(t: float, gpu_index: int) -> list[tuple[bytes, bytes]]:
    return [(h.encode(), orjson.dumps({"host": h, "ts": t + k * 0.01, "code": 79, "gpu_index": gpu_index,
                                       "message": "GPU has fallen off the bus."})) for k, h in enumerate(HOSTS)]


async def xid_faults(bootstrap: str, prefix: str) -> list[dict]:
    found = [orjson.loads(r.value) for r in await read_all(bootstrap, FAULTS.full(prefix), FAULTS.partitions)]
    return [f for f in found if f["code"] == "xid:79"]


async def test_two_workers_share_the_partitions_and_hand_them_over(settings_env, topic_prefix, tmp_path):
    bootstrap = settings_env["FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"]
    await ensure_topics({"bootstrap_servers": bootstrap}, topic_prefix)
    group, t0 = group_id(topic_prefix, "telemetry"), time.time() - 3600
    base = free_ports(2)
    ports = {"a": base, "b": base + 1}
    workers = {name: start(name, tmp_path, port) for name, port in ports.items()}
    log = Logs(tmp_path)
    inputs = {full(i.topic, topic_prefix) for stage in registry.select(None) if stage.worker == "telemetry"
              for step in stage.steps for i in step.inputs}

    async def committed_all() -> bool:
        return await caught_up(bootstrap, group, inputs)
    try:
        async def settled() -> bool:
            return await members(bootstrap, group) == 2
        await wait_for("both workers in the settled group", settled, 90, log)

        # Phase 1: runaways fire, one XID per host.
        await produce(bootstrap, SAMPLES.full(topic_prefix), runaway(PHASE1, 0, t0))
        await produce(bootstrap, XID.full(topic_prefix), xids(t0 + 12, 3))

        async def fired() -> list[Alert] | None:
            alerts = [Alert.model_validate_json(r.value) for r in await read_all(bootstrap, ALERTS.full(topic_prefix),
                                                                                 ALERTS.partitions)]
            ours = [a for a in alerts if a.alertname == "GpuTempSlowdown"]
            return ours if len(ours) >= len(HOSTS) else None
        await wait_for("a firing alert per runaway GPU", fired, 60, log)
        await wait_for("the group to commit every input record", committed_all, 60, log)
        want = expected_received(topic_prefix, await records_on(bootstrap, inputs))
        got = {name: counter(port, "received") for name, port in ports.items()}
        # Each worker holds a share of every stage's input partitions, not all; every record committed was received
        # first, and each worker received some. A record one of them fetched again (between faust resuming the flow
        # and seeking to the committed offset after an assignment) is received twice and skipped by the stages as a
        # replay, so the counters may add up to more than the records (once in CI, one worker's counter passed them all
        # with half the partitions): they say nothing of the share; the outputs below say nothing was done twice.
        held = await assignments(bootstrap, group)
        for stage in registry.select(None):
            if stage.worker == "telemetry":
                ins = {tp for tp in await records_per_partition(bootstrap, {full(i.topic, topic_prefix)
                                                                            for step in stage.steps for i in step.inputs})}
                assert len(held) == 2 and all(0 < len(h & ins) < len(ins) for h in held), (stage.name, held)
        assert all(sum(g[stage] for g in got.values()) >= n for stage, n in want.items()), (want, got)
        assert all(got[name][stage] > 0 for name in got for stage in want), (want, got)
        assert counter(ports["b"], "emitted")["power_thermal"] > 0  # b fired alerts: their state is b's to hand over

        # Phase 2: worker b leaves; a takes its partitions and their state; the runaways cool, a second XID per host.
        stop_worker(workers.pop("b"), tmp_path / "b.log")
        restarts, since = 0, (tmp_path / "a.log").stat().st_size

        def supervise() -> None:
            """compose's `restart: on-failure` for a worker whose table recovery stalled: it stops (exit 1) and starts
            again (streams/faust_adapter/recovery.py; faust 0.15.3 now and then receives no changelog record on a handover).
            A worker that stopped for any other reason fails the test."""
            nonlocal restarts, since
            if workers["a"].poll() is None:
                return
            text = (tmp_path / "a.log").read_bytes()[since:].decode(errors="replace")
            assert workers["a"].returncode == 1 and "table recovery received no changelog record" in text, text[-3000:]
            assert restarts < 2, "the table recovery stalled again after two restarts"
            restarts, since = restarts + 1, (tmp_path / "a.log").stat().st_size
            workers["a"] = start("a", tmp_path, ports["a"])

        async def alone() -> bool:
            supervise()
            return await members(bootstrap, group) == 1
        await wait_for("worker a alone in the settled group", alone, 60, log)
        await produce(bootstrap, SAMPLES.full(topic_prefix), runaway(PHASE2, len(PHASE1), t0))
        await produce(bootstrap, XID.full(topic_prefix), xids(t0 + 70, 4))

        async def resolved() -> list[Alert] | None:
            supervise()
            alerts = [Alert.model_validate_json(r.value) for r in await read_all(bootstrap, ALERTS.full(topic_prefix),
                                                                                 ALERTS.partitions)]
            ours = [a for a in alerts if a.alertname == "GpuTempSlowdown"]
            return ours if sum(a.status == "resolved" for a in ours) >= len(HOSTS) else None
        await wait_for("a resolved alert per runaway GPU", resolved, 120, log)

        async def a_committed_all() -> bool:
            supervise()
            return await committed_all()
        await wait_for("worker a to commit every input record", a_committed_all, 90, log)
    except BaseException:
        for name, proc in workers.items():
            stop_worker(proc, tmp_path / f"{name}.log", failing=True)
        raise
    stop_worker(workers.pop("a"), tmp_path / "a.log")  # a clean stop flushes everything it produced

    alerts = [Alert.model_validate_json(r.value) for r in await read_all(bootstrap, ALERTS.full(topic_prefix),
                                                                         ALERTS.partitions)]
    slowdown = Counter((a.host, a.gpu_index, a.status) for a in alerts if a.alertname == "GpuTempSlowdown")
    assert slowdown == Counter({(h, 5, status): 1 for h in HOSTS for status in ("firing", "resolved")})
    faults = await xid_faults(bootstrap, topic_prefix)
    assert Counter((f["host"], f["gpu_index"]) for f in faults) == Counter(
        {(h, g): 1 for h in HOSTS for g in (3, 4)})  # every XID one fault, none twice
    rows = await read_all(bootstrap, HEALTH.full(topic_prefix), HEALTH.partitions)
    assert {orjson.loads(r.value)["host"] for r in rows} == set(HOSTS)
    assert not [k for k, n in Counter((r.key, r.value) for r in rows).items() if n > 1]  # no row published twice
    print(f"\nphase 1 received per worker: {got}; records on each stage's inputs: {want}; worker a restarted "
          f"{restarts} times after b left")
