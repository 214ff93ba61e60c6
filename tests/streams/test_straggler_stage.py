"""The stragglers faust stages once through agent.test_context(): scoring, re-keying by host, the GPU join, DLQ."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from faust.types import TP

from core.settings import load
from schemas.analytics import StragglerScore
from schemas.codec import encode
from streams import stragglers_stage
from streams.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.registry import StageContext, stage_logger
from streams.settings import StreamsSettings
from streams.straggler_windows import JobState
from tests.streams.helpers import gpu, sample
from tests.streams.test_stragglers import sim_records

PREFIX = "unit."
BY_HOST = f"{PREFIX}fleetpulse-streams-stragglers-by_host"


def settings(tmp_path) -> StreamsSettings:
    return load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX, data_dir=tmp_path,
                streams_batch_within_s=0.05)


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    app = create_app(settings(tmp_path), stages=["stragglers"], emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def changelog(app, table: str) -> list:
    out, pending = [], app.producer.buffer.pending
    while not pending.empty():
        out.append(pending.get_nowait().message)
    return [m for m in out if m.channel.get_topic_name().endswith(f"{table}-changelog")]


def host_samples(host: str, t0: float, seconds: int, hot_from: int) -> list[dict]:
    """GPU 2 of `host` throttles (HW thermal + HW slowdown, 91 C, half clocks) from hot_from on."""
    hot = dict(throttle_reasons=0x48, sm_clock_mhz=990.0)
    return [sample(host, t0 + k, [gpu(i, 91.0 if i == 2 and k >= hot_from else 62.0,
                                      **(hot if i == 2 and k >= hot_from else {"sm_clock_mhz": 1980.0}))
                                  for i in range(8)], seq=k) for k in range(0, seconds, 5)]


async def test_scores_are_rekeyed_by_host_joined_with_the_gpu_condition_and_published(app, emitter):
    metrics = metrics_of(app)["stragglers"]
    records = sim_records(8, 200, seed=3, rank=26, pct=40.0, onset=30.0)  # rank 26 = gpu-node-0003 GPU 2
    t0 = records[0]["ts"] - 1
    async with app.agents["stragglers.gpus"].test_context() as stage:
        await stage.put(b"[]", key=b"h9", partition=1)
        for s in host_samples("gpu-node-0003", t0, 200, hot_from=30):
            await stage.put(encode(s), key=b"gpu-node-0003", partition=5)
        await until(lambda: app.tables["stragglers-gpus"].get("gpu-node-0003", {}).get("ts") == t0 + 195)
    # Written to the changelog only on material change: first sample, GPU 2 turning hot, then 60 s refreshes.
    gpus_log = changelog(app, "stragglers-gpus")
    assert [orjson.loads(m.value)["ts"] - t0 for m in gpus_log] == [0, 30, 90, 150]
    assert {m.partition for m in gpus_log} == {5}

    async with app.agents["stragglers"].test_context() as stage:
        await stage.put(b"\x00 not json", key=b"job-0000", partition=4)
        await stage.put(orjson.dumps({**records[0], "rank": 64}), key=b"job-0000", partition=4)
        for r in records:
            await stage.put(orjson.dumps(r), key=b"job-0000", partition=4)
        await until(lambda: metrics.received == len(records) + 2 and len(emitter.to(BY_HOST)) >= 3)
        await asyncio.sleep(0.2)
    candidates = emitter.to(BY_HOST)
    assert {c.key for c in candidates} == {b"gpu-node-0003"}
    assert {StragglerScore.model_validate_json(c.value).rank for c in candidates} == {26}
    # Refused by the topics' validators (one bad sample too), no dead letter from the worker: the sink writes it.
    assert emitter.to(PREFIX + "fleet.telemetry.nccl.dlq") == [] and (metrics.refused, metrics.errored) == (3, 0)
    jobs_log = changelog(app, "stragglers-jobs")
    assert jobs_log and {(orjson.loads(m.key), m.partition) for m in jobs_log} == {("job-0000", 4)}
    state = JobState.from_json(app.tables["stragglers-jobs"]["job-0000"])
    assert state.flagged.tolist() == [r == 26 for r in range(64)] and state.hosts[3] == "gpu-node-0003"

    async with app.agents["stragglers.attribute"].test_context() as stage:
        for c in candidates:
            await stage.put(c.value, key=c.key, partition=5)
        await stage.put(b'{"job": "x"}', key=b"gpu-node-0003", partition=5)
        await until(lambda: metrics.emitted == len(candidates))
    out = [StragglerScore.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.stragglers")]
    assert {s.key for s in emitter.to(PREFIX + "fleet.stragglers")} == {b"job-0000"} and metrics.errored == 1
    first = out[0]
    assert (first.rank, first.host, first.gpu_index, first.flagged) == (26, "gpu-node-0003", 2, True)
    assert first.slowdown_pct == pytest.approx(40.0, abs=2.0)
    assert first.reasons[0].startswith(f"rank 26 compute {first.slowdown_pct:.1f}% slower than job median (z=")
    assert first.reasons[1] == ("gpu-node-0003 GPU 2 HW thermal slowdown (0x40), HW slowdown (0x8), "
                                "91 C (slowdown at 89 C), SM clock 990 MHz")
    assert first.evidence["throttle_reasons"] == 0x48 and first.evidence["gpu_temp_c"] == 91.0
    assert first.reasons[-1].startswith("job step ~") and metrics.batches >= 3


async def test_idle_jobs_leave_memory_and_tombstone_only_partitions_this_worker_owns(tmp_path, emitter, monkeypatch):
    s = settings(tmp_path)
    app = create_app(s, stages=["power_thermal"], emitter=emitter)
    ctx = StageContext("stragglers", s, metrics_of(app).stage("stragglers"), emitter, stage_logger("stragglers"))
    agents = stragglers_stage.wire(app, ctx, job_ttl_s=0.0, sweep_s=0.0)
    app.finalize()
    app.flow_control.resume()
    records = sim_records(1, 40, seed=1, rank=0)
    table = app.tables["stragglers-jobs"]
    async with agents[0].test_context() as stage:  # no partition assigned: the state stays
        for r in records[:100]:
            await stage.put(orjson.dumps(r), key=b"job-0000", partition=2)
        await until(lambda: "job-0000" in table.data and ctx.metrics.batches >= 1)
    assert changelog(app, "stragglers-jobs")[-1].value is not None
    owned = {TP(PREFIX + "fleet.telemetry.nccl", 2)}
    monkeypatch.setattr(app.assignor, "assigned_actives", lambda: owned)
    async with agents[0].test_context() as stage:
        for r in records[100:]:
            await stage.put(orjson.dumps(r), key=b"job-0000", partition=2)
        await until(lambda: "job-0000" not in table.data)
    tomb = changelog(app, "stragglers-jobs")[-1]
    assert (tomb.key, tomb.value, tomb.partition) == (b'"job-0000"', None, 2)
