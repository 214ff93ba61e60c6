"""A stage whose lane crashes is seen: counted, /healthz fails naming it, and the worker stops loudly with what the lane
had not finished left for the next one."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import orjson
import pytest

from streams.metrics import MetricsRegistry
from streams.metrics_server import health, serve
from streams.runtime.lane import Lane


class Events:
    """What faust's stream hands a lane: batches of events (here none are needed before the failure)."""

    def __init__(self, batches: int):
        self.batches = batches

    async def take_events(self, _max: int, within: float):
        for _ in range(self.batches):
            yield []


def test_a_crashed_lane_is_counted_on_each_of_its_stages_and_fails_health_for_a_minute():
    metrics = MetricsRegistry()
    a, b = metrics.stage("health"), metrics.stage("stragglers")

    class Broken(Lane):
        async def batch(self, events):  # the second batch fails as a producer error past its retries would
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen == 2:
                raise ConnectionError("broker went away")

    lane = Broken.__new__(Broken)
    lane.name, lane.batch_max, lane.within_s = "telemetry", 10, 0.1
    lane.inbox, lane._one_batch = None, asyncio.Lock()
    lane.stages = [type("W", (), {"metrics": a})(), type("W", (), {"metrics": b})()]
    with pytest.raises(ConnectionError):
        asyncio.run(lane.run(Events(3)))
    assert (a.crashes, b.crashes) == (1, 1) and "broker went away" in a.last_error
    ok, body = health(metrics)
    assert not ok and body["failing"] == ["health", "stragglers"]
    later = a.crash_times[-1] + 61
    assert health(metrics, now=later)[0]  # a minute without a crash: healthy again


def test_healthz_answers_503_naming_the_stage_and_metrics_count_the_crashes():
    metrics = MetricsRegistry()
    metrics.stage("power_thermal")
    server = serve(metrics, 0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert orjson.loads(urllib.request.urlopen(url + "/healthz", timeout=5).read())["healthy"] is True
        metrics["power_thermal"].crashed(RuntimeError("boom"))
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "/healthz", timeout=5)
        assert err.value.code == 503 and orjson.loads(err.value.read())["failing"] == ["power_thermal"]
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        assert 'fleetpulse_stage_crashes_total{stage="power_thermal"} 1.0' in text
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration
async def test_a_worker_whose_output_the_broker_refuses_gives_up_loudly_and_loses_nothing(
        settings_env, kafka_bootstrap, topic_prefix, tmp_path):
    """A real producer error that no retry mends (the faults topic set to take 64-byte records): the lane that sends
    there crashes, takes no more records, and the worker exits 1 naming the stage and the error, not half-alive; the
    XID stays uncommitted, so a worker started once the topic is mended turns it into exactly one fault."""
    import os
    import subprocess
    import sys
    import time
    from datetime import datetime

    from schemas.provision import ensure_topics
    from schemas.topics import FAULTS, XID
    from tests.pipeline import REPO
    from tests.streams.broker import produce, read_all, stop_worker, wait_for
    from tests.test_dead_letters_end_to_end import _allow_records_of

    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    faults = FAULTS.full(topic_prefix)
    await _allow_records_of(kafka_bootstrap, faults, 64)
    xid = {"host": "h1", "ts": time.time() - 60, "code": 79, "gpu_index": 3, "message": "GPU has fallen off the bus."}
    await produce(kafka_bootstrap, XID.full(topic_prefix), [(b"h1", orjson.dumps(xid))])
    log = tmp_path / "worker.log"

    def worker(**env: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "fault_bins"], cwd=REPO,
                                stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env})

    proc = worker()
    try:
        rc = await asyncio.to_thread(proc.wait, 120)
    except subprocess.TimeoutExpired:
        stop_worker(proc, log, failing=True)
        raise AssertionError(f"the worker did not give up:\n{log.read_text()[-4000:]}") from None
    exited, text = datetime.now(), log.read_text()
    assert rc == 1, text[-3000:]
    assert "stage fault_bins crashed (MessageSizeTooLargeError" in text and text.count("lane telemetry crashed") == 1
    # Stopped within seconds of deciding to: faust restarted the crashed lane with an actor its stop skipped, and
    # waited for the crashed batch's records to be acknowledged, so the worker hung until SIGKILL.
    line = next(ln for ln in text.splitlines() if "stopping the worker" in ln)
    assert (exited - datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")).total_seconds() < 15, text[-3000:]

    await _allow_records_of(kafka_bootstrap, faults, 1 << 20)

    async def fault() -> list[dict]:
        out = [orjson.loads(r.value) for r in await read_all(kafka_bootstrap, faults, FAULTS.partitions)]
        return [f for f in out if (f["host"], f["code"]) == ("h1", "xid:79")]

    proc = worker()
    try:
        await wait_for("the XID's fault, once the topic takes it", fault, 90, log)
        await asyncio.sleep(2)  # time for a duplicate to show, were one sent
    finally:
        stop_worker(proc, log)
    assert len(await fault()) == 1
