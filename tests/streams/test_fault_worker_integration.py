"""The fault-bin stage in a worker process on a real broker: a simulated Xid 79 + ECC DBE run, and its latency."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.simulator import FleetSimulator
from schemas.provision import ensure_topics
from schemas.analytics import FaultEvent
from schemas.codec import encode
from schemas.topics import FAULTS, SAMPLES, XID
from tests.conftest import REPO
from tests.streams.broker import stop_worker

pytestmark = pytest.mark.integration

HOSTS, TICKS, TICK_WALL_S = 4, 46, 0.25
# Six double-bit ECC errors and six GPUs falling off the bus (back after a 3 s reboot), each on its own GPU.
SCENARIO = {"name": "xid79-dbe", "faults": [
    *({"kind": "ecc_dbe", "at": 4 + 6 * i, "host": i % HOSTS, "gpu": i} for i in range(6)),
    *({"kind": "gpu_lost", "at": 7 + 6 * i, "duration": 3, "host": (i + 1) % HOSTS, "gpu": 7 - i} for i in range(6)),
]}
PER_KIND = {  # (code, bin, rule) each injection must yield exactly once
    "ecc_dbe": [("xid:48", "reset", "workflow_48"), ("xid:63", "ignore", "catalog"),
                ("xid:154", "reset", "workflow_154"), ("ecc_dbe", "reset", "counter_dbe"),
                ("row_remap_pending", "reset", "counter_row_remap")],
    "gpu_lost": [("xid:79", "reboot", "catalog"), ("xid:154", "reboot", "workflow_154"),
                 ("gpu_lost", "reboot", "gpu_lost")],
}


def start_worker(log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "fault_bins"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


class FaultReader:
    """Reads fleet.faults from the start in the background, stamping each record with its arrival time."""

    def __init__(self, bootstrap: str, topic: str):
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                         fetch_max_wait_ms=10)
        self.topic, self.got, self.task = topic, [], None

    async def start(self) -> None:
        await self.consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(FAULTS.partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_beginning(*tps)
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for batch in (await self.consumer.getmany(timeout_ms=10)).values():
                now = time.monotonic()
                self.got += [(now, FaultEvent.model_validate_json(r.value)) for r in batch]

    async def wait(self, what: str, predicate, timeout: float, log) -> None:
        deadline = time.monotonic() + timeout
        while not predicate([f for _, f in self.got]):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; worker log:\n{log.read_text()[-4000:]}")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.task.cancel()
        await self.consumer.stop()


async def test_xid79_and_dbe_run_yields_exactly_the_expected_faults_fast(kafka_bootstrap, settings_env,
                                                                        topic_prefix, tmp_path):
    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    log = tmp_path / "worker.log"
    worker = start_worker(log)
    reader = FaultReader(kafka_bootstrap, FAULTS.full(topic_prefix))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True, linger_ms=0)
    await reader.start()
    await producer.start()
    sim = FleetSimulator(HOSTS, seed=7, start_ts=time.time() - 600, scenario=SCENARIO, nccl_interval=0)
    xid_topic, samples_topic = XID.full(topic_prefix), SAMPLES.full(topic_prefix)
    sent_at: dict[tuple, float] = {}
    try:
        warm = sim.step()  # the first tick, and one Xid 13 on its own host, prove the worker is consuming
        probe = {**warm.samples[0], "host": "warm-up"}
        probe_xid = {"host": "warm-up", "ts": warm.ts, "code": 13, "gpu_index": 0, "message": "warm-up"}
        for s in warm.samples + [probe]:
            await producer.send_and_wait(samples_topic, encode(s), key=s["host"].encode())
        await producer.send_and_wait(xid_topic, encode(probe_xid), key=b"warm-up")
        await reader.wait("the warm-up fault", lambda fs: any(f.host == "warm-up" for f in fs), 90, log)
        for _ in range(TICKS - 1):
            started = time.monotonic()
            tick = sim.step()
            for x in tick.xid:
                sent_at[(x["host"], x["gpu_index"], f"xid:{x['code']}", x["ts"])] = time.monotonic()
                await producer.send_and_wait(xid_topic, encode(x), key=x["host"].encode())
            await asyncio.gather(*[await producer.send(samples_topic, encode(s), key=s["host"].encode())
                                   for s in tick.samples])
            await asyncio.sleep(max(0.0, TICK_WALL_S - (time.monotonic() - started)))
        truth = [i for i in sim.faults.injections if i.started]
        expected = Counter((sim.fleet.hosts[i.host], int(i.gpus[0] % 8), *cbr)
                           for i in truth for cbr in PER_KIND[i.spec.kind])
        await reader.wait("every expected fault", lambda fs: sum(f.host != "warm-up" for f in fs) >= 48, 60, log)
        await asyncio.sleep(2.0)  # and nothing more
    finally:
        await producer.stop()
        await reader.stop()
        stop_worker(worker, log, failing=sys.exc_info()[0] is not None)

    got = [(t, f) for t, f in reader.got if f.host != "warm-up"]
    seen = Counter((f.host, f.gpu_index, f.code, f.bin, f.rule) for _, f in got)
    assert len(truth) == 12 and sum(expected.values()) == 48
    assert seen == expected
    assert all(f.evidence["emission"] == "first" and f.count == 1 for _, f in got)
    assert len({f.fault_id for _, f in got}) == 48
    latency = [t - sent_at[(f.host, f.gpu_index, f.code, f.first_ts)] for t, f in got if f.code.startswith("xid:")]
    assert len(latency) == 30
    p50, p95 = np.percentile(latency, [50, 95])
    print(f"\nXID published -> FaultEvent received over a real broker ({len(latency)} XIDs): "
          f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(latency) * 1000:.0f} ms")
    assert p95 < 1.0, f"p95 {p95:.3f} s leaves too little of the 2 s XID -> drain budget"
