"""The stragglers stages on a real broker: a simulated slow rank and a throttling GPU, and only they, are flagged."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agents.simulator.simulate import FleetSimulator, simulate
from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.analytics import StragglerScore
from schemas.topics import NCCL, SAMPLES, STRAGGLERS
from streams.groups import app_id
from streams.stragglers.windows import Batch
from streams.stragglers.scoring import advance
from tests.streams.broker import produce, read_all, stop_worker, wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

# One 64-rank job on 8 hosts: rank 5 computes 20% slower with nothing to show why; GPU 2 of host 3 (rank 26)
# overheats past its 89 C slowdown limit and runs at half clocks. Both from 30 s in, for the rest of the run.
SCENARIO = {"name": "stragglers-it", "faults": [
    {"kind": "slow_rank", "at": 30, "job": 0, "rank": 5, "slowdown_pct": 20},
    {"kind": "thermal_runaway", "at": 30, "host": 3, "gpu": 2, "peak_c": 91, "ramp_s": 15},
]}
HOSTS, SECONDS, SEED = 8, 240, 11


async def create_internal_topic(bootstrap: str, name: str) -> None:
    """Create the by-host topic up front and wait for its leaders.

    A worker that creates it itself can subscribe before the new topic reaches the cluster metadata; faust then
    ignores it until the next metadata refresh (minutes), and no score is attributed meanwhile. streams/cli.py
    creates only the registry's topics before the worker starts (see the stage's report).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, SAMPLES.partitions, 1)])
        deadline = time.monotonic() + 30
        while True:
            [d] = await admin.describe_topics([name])
            if d["error_code"] == 0 and d["partitions"] and all(p["leader"] >= 0 for p in d["partitions"]):
                return
            assert time.monotonic() < deadline, f"{name} has no leaders"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _logged(log, line: str) -> bool:
    return line in log.read_text()


def expected(start_ts: float) -> list[tuple[int, float, bool]]:
    """(rank, window start, flagged) the pure core gives for the same simulated timings, in one pass."""
    sim = FleetSimulator(HOSTS, seed=SEED, scenario=SCENARIO, start_ts=start_ts)
    records = [r for _ in range(SECONDS) for r in sim.step().nccl]
    _, scores, _ = advance(None, "job-0000", Batch.of(records))
    return sorted((s.rank, s.window_start, s.flagged) for s in scores)


async def test_slow_rank_and_hot_gpu_flagged_alone_with_their_cause(kafka_bootstrap, settings_env, topic_prefix,
                                                                    tmp_path):
    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    await create_internal_topic(kafka_bootstrap, f"{app_id(topic_prefix)}-stragglers-by_host")
    start_ts = float(int(time.time()) - 3600)
    want = expected(start_ts)
    assert {r for r, _, _ in want} == {5, 26} and all(flagged for _, _, flagged in want)
    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2"}
    worker = subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "stragglers"], cwd=REPO, env=env,
                              stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    out_topic = STRAGGLERS.full(topic_prefix)

    async def published() -> list[StragglerScore] | None:
        got = [StragglerScore.model_validate_json(r.value)
               for r in await read_all(kafka_bootstrap, out_topic, STRAGGLERS.partitions)]
        return got if len(got) >= len(want) else None

    try:
        report = await simulate(load(CommonSettings), hosts=HOSTS, duration=SECONDS, seed=SEED, scenario=SCENARIO,
                                speed=0, start_ts=start_ts)
        sent = await produce(kafka_bootstrap, NCCL.full(topic_prefix), [(b"job-0000", b"{not json")])
        scores = await wait_for("the straggler scores", published, 90, log)
        refusal = f"refused {NCCL.full(topic_prefix)}[{sent[0].partition}]@{sent[0].offset}"
        await wait_for("the poison record's refusal", lambda: _logged(log, refusal), 30, log)
    except BaseException:
        stop_worker(worker, log, failing=True)
        raise
    stop_worker(worker, log)

    assert report.sent["fleet.telemetry.nccl"] == HOSTS * SECONDS  # one NcclStep per host and collective
    assert report.nccl_timings == HOSTS * 8 * SECONDS
    assert [t.rank for t in report.truth] == [5, 26]
    assert sorted((s.rank, s.window_start, s.flagged) for s in scores) == want  # the pipeline = the pure core
    slow = [s for s in scores if s.rank == 5]
    hot = [s for s in scores if s.rank == 26]
    assert all((s.host, s.gpu_index, s.job) == ("gpu-node-0000", 5, "job-0000") for s in slow)
    assert all((s.host, s.gpu_index) == ("gpu-node-0003", 2) for s in hot)
    assert all(s.slowdown_pct == pytest.approx(20.0, abs=2.0) for s in slow)
    assert all(s.slowdown_pct > 50.0 and s.job_slowdown_pct > 50.0 for s in hot)  # half clocks: x1.7 compute
    # The why: the join with the GPU's throttle reasons and temperature.
    for s in hot:
        assert s.reasons[1].startswith("gpu-node-0003 GPU 2 HW thermal slowdown (0x40), HW slowdown (0x8), ")
        assert " C (slowdown at 89 C)" in s.reasons[1] and s.evidence["gpu_temp_c"] >= 89
        assert int(s.evidence["throttle_reasons"]) & 0x48 == 0x48
    for s in slow:
        assert "shows no throttle reason" in s.reasons[1] and s.evidence["throttle_reasons"] == 0
    assert await read_all(kafka_bootstrap, NCCL.dlq(topic_prefix), 1) == []  # the sink (not running) dead-letters it
    print(f"\nflagged {sorted({s.rank for s in scores})}; first reasons: {hot[0].reasons[:2]} / {slow[0].reasons[:2]}")
