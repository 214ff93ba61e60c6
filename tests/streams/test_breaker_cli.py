"""The breaker on a real broker: a drain storm trips it, `fleetpulse breaker` shows and resets it, drains resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.provision import ensure_topics
from schemas.analytics import Alert, DrainEvent, FaultEvent, HealthScore, NodeState
from schemas.codec import encode
from schemas.topics import ALERTS, DRAIN, FAULTS, HEALTH, NODE_STATE
from tests.streams.broker import produce, read_all, stop_worker, wait_for

REPO = Path(__file__).resolve().parents[2]
HOSTS = [f"n{i:02d}" for i in range(10)]
pytestmark = pytest.mark.integration


def node_row(host: str, ts: float, gates: dict[str, float] | None = None) -> tuple[bytes, bytes]:
    gates = gates or {}
    return host.encode(), encode(HealthScore(
        ts=ts, host=host, score=20.0 if gates else 100.0, schedulable=not gates, gates=sorted(gates),
        inputs={"installed_gpus": 8, "present_gpus": 8, **{f"gate_since.{g}": t for g, t in gates.items()}}))


def cli(*args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "fleetpulse.cli", "breaker", *args], cwd=REPO, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.stdout, done.stderr.decode()[-2000:]
    return done.returncode, json.loads(done.stdout)


async def test_a_storm_trips_the_breaker_and_an_operator_reset_lets_drains_resume(kafka_bootstrap, settings_env,
                                                                                 topic_prefix, tmp_path):
    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    t0 = time.time() - 3600
    await produce(kafka_bootstrap, HEALTH.full(topic_prefix), [node_row(h, t0) for h in HOSTS])
    storm = HOSTS[:5]  # cap for 10 nodes: max(3, 5%) = 3
    await produce(kafka_bootstrap, FAULTS.full(topic_prefix), [
        (h.encode(), encode(FaultEvent(fault_id=f"{h}-79", ts=t0 + 10, host=h, gpu_index=3, code="xid:79",
                                       bin="reboot", rule="catalog", first_ts=t0 + 10, last_ts=t0 + 10)))
        for h in storm])

    async def drains() -> list[str]:
        return sorted(DrainEvent.model_validate_json(r.value).host
                      for r in await read_all(kafka_bootstrap, DRAIN.full(topic_prefix), 8))

    async def alerts() -> list[Alert]:
        return [Alert.model_validate_json(r.value) for r in await read_all(kafka_bootstrap, ALERTS.full(topic_prefix),
                                                                          8)]

    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "lifecycle"], cwd=REPO, env=env,
                              stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await wait_for("the breaker alert", alerts, 60, log)
        await wait_for("the last denial", lambda: _states(kafka_bootstrap, topic_prefix, "suspect", 2), 30, log)
        assert len(await drains()) == 3
        code, status = cli("status")
        assert code == 0 and (status["breaker"], status["trips"], status["denied_since_open"]) == ("open", 1, 2)
        assert status["known_nodes"] == 10 and len(status["drains_in_window"]) == 3
        code, after = cli("reset", "--by", "alice", "--note", "one bad rack PDU, fixed")
        assert code == 0 and after["breaker"] == "closed" and after["last_reset"]["by"] == "alice"
        held = [h for h in storm if h not in await drains()]
        await produce(kafka_bootstrap, HEALTH.full(topic_prefix),  # the held nodes' gates, a minute on
                      [node_row(h, t0 + 90, {"gpu3/fault_bin:reboot": t0 + 10}) for h in held])
        await wait_for("the held nodes' drains", lambda: _has(drains, 5), 30, log)
    except BaseException:
        stop_worker(worker, log, failing=True)
        raise
    stop_worker(worker, log)
    assert await drains() == sorted(storm)
    fired = [(a.alertname, a.status) for a in await alerts()]
    assert fired == [("FleetDrainBreakerOpen", "firing"), ("FleetDrainBreakerOpen", "resolved")]


async def _states(bootstrap: str, prefix: str, state: str, count: int) -> bool:
    records = await read_all(bootstrap, NODE_STATE.full(prefix), 8)
    return sum(NodeState.model_validate_json(r.value).state == state for r in records) >= count


async def _has(probe, count: int) -> bool:
    return len(await probe()) >= count
