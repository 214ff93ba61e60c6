"""A stage whose lane keeps crashing is seen: counted, /healthz fails naming it, and the worker gives up loudly."""

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
