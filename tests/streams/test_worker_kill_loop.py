"""The stream worker killed with SIGKILL ten times at random points while XIDs keep arriving: each restart resumes
from its committed offsets and state, and in the end every XID became exactly one fault (one fault id each; a record
sent again after a kill carries the same id, at most one uncommitted batch per kill)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import orjson
import pytest

from core.settings import CommonSettings, load
from schemas.provision import ensure_topics
from schemas.topics import FAULTS, XID
from streams.groups import group_id
from tests.conftest import REPO
from tests.streams.broker import group_is_empty
from tests.streams.broker import produce, read_all, stop_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KILLS, HOSTS, GPUS = 10, 20, 8


def start(log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
           "FLEETPULSE_STREAMS_SESSION_TIMEOUT_S": "6", "FLEETPULSE_STREAMS_COMMIT_INTERVAL_S": "0.5"}
    return subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "fault_bins"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


async def test_the_worker_killed_ten_times_turns_every_xid_into_one_fault(settings_env, topic_prefix, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), topic_prefix)
    t0 = time.time() - 3600
    pairs = [(f"h{h:02d}", g) for h in range(HOSTS) for g in range(GPUS)]
    random.Random(5).shuffle(pairs)
    xids = [(host.encode(), orjson.dumps({"host": host, "ts": t0 + k, "code": 13, "gpu_index": g,
                                          "message": "Graphics Engine Exception"}))
            for k, (host, g) in enumerate(pairs)]
    per_round = len(xids) // (KILLS + 1) + 1
    rng, log = random.Random(9), tmp_path / "worker.log"
    group = group_id(topic_prefix, "telemetry")
    for k in range(KILLS):
        await produce(settings.bootstrap, XID.full(topic_prefix), xids[k * per_round:(k + 1) * per_round])
        worker = start(log)
        await asyncio.sleep(rng.uniform(2.0, 8.0))  # in start-up, mid-batch, between outputs and commit, idle
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        await wait_for(f"kill {k + 1}'s member to leave the group", lambda: group_is_empty(settings.bootstrap, group),
                       30, log)
    await produce(settings.bootstrap, XID.full(topic_prefix), xids[KILLS * per_round:])
    worker = start(log)
    try:
        async def faults() -> list[dict] | None:
            records = await read_all(settings.bootstrap, FAULTS.full(topic_prefix), FAULTS.partitions)
            found = [orjson.loads(r.value) for r in records]
            return found if len({f["fault_id"] for f in found}) >= len(xids) else None
        found = await wait_for("a fault for every XID", faults, 120, log)
    finally:
        stop_worker(worker, log)
    ids = Counter(f["fault_id"] for f in found)
    by_pair = Counter((f["host"], f["gpu_index"]) for f in {f["fault_id"]: f for f in found}.values())
    assert len(ids) == len(xids) and by_pair == Counter(pairs)  # one fault id per XID, none lost, none extra
    assert sum(ids.values()) - len(ids) <= KILLS * 500  # re-sent at most an uncommitted batch per kill
    assert log.read_text().count("crashed") == 0
