"""The stragglers stage on the runtime, through its lanes' agents under test_context(): scoring, re-keying by host,
the GPU join (and holding a score until its host's samples reach the window), refusals, and the job TTL."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from core.settings import load
from schemas.analytics import StragglerScore
from schemas.codec import encode
from schemas.events import timings_of
from streams.faust_adapter.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.settings import StreamsSettings
from streams.stragglers.windows import JobState
from tests.streams.helpers import drain_changelog, gpu, put_on, sample, until
from tests.streams.test_stragglers import sim_records

PREFIX = "unit."
NCCL_T, SAMPLES_T = PREFIX + "fleet.telemetry.nccl", PREFIX + "fleet.telemetry.samples"
BY_HOST = f"{PREFIX}fleetpulse-streams-stragglers-by_host"


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX, data_dir=tmp_path,
                    streams_batch_within_s=0.05, stages=["stragglers"])
    app = create_app(settings, emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


def job_state(app) -> JobState:
    raw = app.tables["stragglers-jobs"]["job-0000"]
    return raw if isinstance(raw, JobState) else JobState.from_json(raw)


def host_samples(host: str, t0: float, seconds: int, hot_from: int) -> list[dict]:
    """GPU 2 of `host` throttles (HW thermal + HW slowdown, 91 C, half clocks) from hot_from on."""
    hot = dict(throttle_reasons=0x48, sm_clock_mhz=990.0)
    return [sample(host, t0 + k, [gpu(i, 91.0 if i == 2 and k >= hot_from else 62.0,
                                      **(hot if i == 2 and k >= hot_from else {"sm_clock_mhz": 1980.0}))
                                  for i in range(8)], seq=k) for k in range(0, seconds, 5)]


async def test_scores_are_rekeyed_by_host_joined_with_the_gpu_condition_and_published(app, emitter):
    metrics = metrics_of(app)["stragglers"]
    steps = sim_records(8, 200, seed=3, rank=26, pct=40.0, onset=30.0)  # rank 26 = gpu-node-0003 GPU 2
    t0 = steps[0]["ranks"][0]["ts"] - 1
    telemetry, nccl = app.agents["lane.telemetry"], app.agents["lane.nccl"]
    samples = host_samples("gpu-node-0003", t0, 200, hot_from=30)
    written = []
    async with telemetry.test_context() as stage:
        await put_on(stage, SAMPLES_T, b"[]", b"h9", 1)
        for group in (samples[:6], samples[6:12], samples[12:17], samples[17:]):  # one batch each: 0-25 s cool,
            for s in group:  # 30-55 s GPU 2 hot, 60-80 s unchanged, 85-195 s unchanged (60 s refreshes due)
                await put_on(stage, SAMPLES_T, encode(s), b"gpu-node-0003", 5)
            await until(lambda: (app.tables["stragglers-gpus"].get("gpu-node-0003") or {}).get("ts") == group[-1]["ts"])
            written.append([orjson.loads(m.value)["ts"] - t0 for m in drain_changelog(emitter, "stragglers-gpus")])
    # A batch writes the host's newest condition to the changelog (on the samples' partition) only when it changed
    # materially: the first sample, GPU 2 turning hot, a 60 s refresh; not for the unchanged 60-80 s.
    assert written == [[25], [55], [], [195]]

    legacy = timings_of(steps[0])  # the older one-record-per-rank form still decodes
    taken = metrics.received
    async with nccl.test_context() as stage:
        await put_on(stage, NCCL_T, b"\x00 not json", b"job-0000", 4)
        await put_on(stage, NCCL_T, orjson.dumps({**legacy[0], "rank": 64}), b"job-0000", 4)  # rank >= world
        for r in legacy:
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0000", 4)
        for r in steps[1:]:
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0000", 4)
        await until(lambda: metrics.received - taken == len(legacy) + len(steps) - 1
                    and len(emitter.to(BY_HOST)) >= 3)
    candidates = emitter.to(BY_HOST)
    assert {c.key for c in candidates} == {b"gpu-node-0003"}
    assert {StragglerScore.model_validate_json(c.value).rank for c in candidates} == {26}
    # Refused by the topics' validators (one bad sample too), no dead letter from the worker: the sink writes it.
    assert emitter.to(PREFIX + "fleet.telemetry.nccl.dlq") == [] and metrics.errors == 0
    assert metrics_of(app).refused == {SAMPLES_T: 1, NCCL_T: 2}
    jobs_log = drain_changelog(emitter, "stragglers-jobs")  # window closes and checkpoints, on the job's partition
    assert jobs_log and {(orjson.loads(m.key), m.partition) for m in jobs_log} == {("job-0000", 4)}
    state = job_state(app)
    assert state.flagged.tolist() == [r == 26 for r in range(64)] and state.hosts[3] == "gpu-node-0003"

    async with telemetry.test_context() as stage:
        for c in candidates:
            await put_on(stage, BY_HOST, c.value, c.key, 5)
        await put_on(stage, BY_HOST, b'{"job": "x"}', b"gpu-node-0003", 5)  # an internal record: dead-lettered
        await until(lambda: metrics.emitted == len(candidates) and metrics.errors == 1)
    out = [StragglerScore.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.stragglers")]
    assert {s.key for s in emitter.to(PREFIX + "fleet.stragglers")} == {b"job-0000"}
    assert len(emitter.to(PREFIX + "fleet.telemetry.nccl.dlq")) == 1
    first = out[0]
    assert (first.rank, first.host, first.gpu_index, first.flagged) == (26, "gpu-node-0003", 2, True)
    assert first.slowdown_pct == pytest.approx(40.0, abs=2.0)
    assert first.reasons[0].startswith(f"rank 26 compute {first.slowdown_pct:.1f}% slower than job median (z=")
    assert first.reasons[1] == ("gpu-node-0003 GPU 2 HW thermal slowdown (0x40), HW slowdown (0x8), "
                                "91 C (slowdown at 89 C), SM clock 990 MHz")
    assert first.evidence["throttle_reasons"] == 0x48 and first.evidence["gpu_temp_c"] == 91.0
    assert first.reasons[-1].startswith("job step ~")


async def test_a_score_waits_for_its_hosts_samples_to_reach_the_window(app, emitter):
    """A replay reads both topics at once: a score ahead of its host's samples is held (durably) until they catch up,
    then explained by the condition at the window, not by the older one."""
    steps = sim_records(8, 200, seed=3, rank=26, pct=40.0, onset=30.0)
    t0 = steps[0]["ranks"][0]["ts"] - 1
    async with app.agents["lane.nccl"].test_context() as stage:
        for r in steps:
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0000", 4)
        await until(lambda: len(emitter.to(BY_HOST)) >= 3)
    first = StragglerScore.model_validate_json(emitter.to(BY_HOST)[0].value)
    samples = host_samples("gpu-node-0003", t0, 200, hot_from=30)
    before = [s for s in samples if s["ts"] < first.window_start - 60]
    after = [s for s in samples if s["ts"] >= first.window_start - 60]
    drain_changelog(emitter)
    async with app.agents["lane.telemetry"].test_context() as stage:
        for s in before:  # the host's condition is well behind the window
            await put_on(stage, SAMPLES_T, encode(s), b"gpu-node-0003", 5)
        await put_on(stage, BY_HOST, emitter.to(BY_HOST)[0].value, b"gpu-node-0003", 5)
        await until(lambda: app.tables["stragglers-held"].get("gpu-node-0003") is not None)
        assert emitter.to(PREFIX + "fleet.stragglers") == []
        assert [m.partition for m in drain_changelog(emitter, "stragglers-held")] == [5]  # held durably
        for s in after:
            await put_on(stage, SAMPLES_T, encode(s), b"gpu-node-0003", 5)
        await until(lambda: len(emitter.to(PREFIX + "fleet.stragglers")) == 1)
    [published] = [StragglerScore.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.stragglers")]
    assert "HW thermal slowdown" in published.reasons[1] and "before the window end" not in published.reasons[1]
    assert "gpu-node-0003" not in app.tables["stragglers-held"]
    assert [m.value for m in drain_changelog(emitter, "stragglers-held")] == [None]  # the tombstone


async def test_a_job_that_stops_is_forgotten_once_its_partition_moves_on(app, emitter):
    wired = next(w for lane in app.fleetpulse.lanes for w in lane.stages if w.spec.name == "stragglers"
                 and w.step.lane == "nccl")
    wired.config = dataclasses.replace(wired.config, job_ttl_s=60.0)
    steps = sim_records(1, 40, seed=1, rank=0)

    def job(name: str, shift: float) -> list[dict]:
        return [{**s, "job": name, "ranks": [{**r, "ts": r["ts"] + shift} for r in s["ranks"]]} for s in steps]

    table = app.tables["stragglers-jobs"]
    async with app.agents["lane.nccl"].test_context() as stage:
        for r in steps:
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0000", 2)
        await until(lambda: "job-0000" in table.data)
        for r in job("job-0002", 100.0):  # another partition's batches never touch partition 2's keys
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0002", 6)
        await until(lambda: "job-0002" in table.data)
        assert "job-0000" in table.data
        for r in job("job-0001", 100.0):  # partition 2's own records, 100 s on: job-0000 has stopped
            await put_on(stage, NCCL_T, orjson.dumps(r), b"job-0001", 2)
        await until(lambda: "job-0000" not in table.data)
    tombs = [m for m in drain_changelog(emitter, "stragglers-jobs") if m.value is None]
    assert [(m.key, m.partition) for m in tombs] == [(b'"job-0000"', 2)]
    assert "job-0001" in table.data and "job-0002" in table.data
