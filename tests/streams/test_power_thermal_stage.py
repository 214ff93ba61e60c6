"""The power/thermal faust stage once through agent.test_context(): batching, dead letters, table partitions."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from core.settings import load
from schemas.analytics import Alert
from schemas.codec import encode
from streams.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.power_thermal import Config
from streams.power_thermal_stage import evaluate_isolating
from streams.settings import StreamsSettings
from tests.streams.helpers import gpu, sample, temps_series, until

PREFIX = "unit."


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX,
                    data_dir=tmp_path, streams_batch_within_s=0.05, rack_budgets_w={"r1": 3_000.0})
    app = create_app(settings, emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


def drain_changelog(app) -> list:
    """The table changelog records the stage queued on the (unstarted) producer."""
    out, pending = [], app.producer.buffer.pending
    while not pending.empty():
        out.append(pending.get_nowait().message)
    return out


async def test_stage_alerts_refuses_bad_samples_and_keeps_co_partitioned_state(app, emitter):
    metrics = metrics_of(app)["power_thermal"]
    h1 = temps_series("h1", [90] * 5 + [80] * 20)  # fires and resolves on GPU 0
    h2 = temps_series("h2", [60] * 25, t0=1_001.0)  # never alerts
    async with app.agents["power_thermal"].test_context() as stage:
        await stage.put(b"\x00 not json", key=b"h9", partition=6)
        for a, b in zip(h1, h2):  # interleaved: each batch mixes partitions 3 and 5
            await stage.put(encode(a), key=b"h1", partition=3)
            await stage.put(encode(b), key=b"h2", partition=5)
        await until(lambda: metrics.received == 51 and metrics.batches >= 1 and len(emitter.sent) >= 4)
        await asyncio.sleep(0.2)  # nothing more may follow

    alerts = [Alert.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.alerts")]
    assert [(a.alertname, a.status, a.host, a.gpu_index) for a in alerts] == [
        ("GpuTempNearShutdown", "firing", "h1", 0), ("GpuTempSlowdown", "firing", "h1", 0),
        ("GpuTempSlowdown", "resolved", "h1", 0), ("GpuTempNearShutdown", "resolved", "h1", 0)]
    assert {s.key for s in emitter.to(PREFIX + "fleet.alerts")} == {b"h1"}
    assert (metrics.emitted, metrics.errored, metrics.refused) == (4, 0, 1)
    assert emitter.to(PREFIX + "fleet.telemetry.samples.dlq") == []  # the sink dead-letters what the validator refused

    # Host state recovers where the host's samples live: changelog partition = source partition, per key.
    table = app.tables["power_thermal-hosts"]
    assert table["h1"]["wm"] == h1[-1]["ts"]
    # nothing firing or pending; resolved alerts stay remembered for the flap window
    assert all(not firing and pending is None for pending, firing, *_ in table["h1"]["alerts"].values())
    changelog = [m for m in drain_changelog(app)
                 if m.channel.get_topic_name().endswith("power_thermal-hosts-changelog")]
    assert changelog and {(orjson.loads(m.key), m.partition) for m in changelog} == {("h1", 3)}

    # Rack power reports (r1, 3 kW budget; 2 hosts x 2 GPUs x 450 W = 1.8 kW) go to the internal topic keyed by rack.
    reports = [s for s in emitter.sent if s.topic.endswith("power_thermal-rack_power")]
    assert len(reports) == 50 and {s.key for s in reports} == {b"r1"}


async def test_rack_stage_fires_from_forwarded_reports(app, emitter):
    reports = [{"rack": "r1", "host": h, "ts": 1_000.0 + 10 * i, "power_w": 1_600.0, "complete": True}
               for i in range(6) for h in ("h1", "h2")]
    async with app.agents["power_thermal.racks"].test_context() as stage:
        await stage.put(b"{}", key=b"r1", partition=2)  # not a report: dead-lettered, the stage goes on
        for r in reports:
            await stage.put(orjson.dumps(r), key=b"r1", partition=2)
        await until(lambda: any(s.topic.endswith("fleet.alerts") for s in emitter.sent))
    [alert] = [Alert.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.alerts")]
    assert (alert.alertname, alert.status, alert.rack, alert.value, alert.ts) == (
        "RackPowerOverBudget", "firing", "r1", 3_200.0, 1_030.0)
    assert len(emitter.to(PREFIX + "fleet.telemetry.samples.dlq")) == 1
    assert app.tables["power_thermal-racks"]["r1"]["alerts"]["RackPowerOverBudget"][1] is True


def test_a_record_the_rules_choke_on_is_isolated_not_the_batch():
    good = temps_series("h1", [95.0, 95.0])
    bad = sample("h2", 1_000.0, [gpu(0, 95.0)])
    bad["seq"] = "not a number"  # got past a lean check: the alert built from it raises
    items = [("e1", good[0]), ("e-bad", bad), ("e2", good[1])]
    result, failed = evaluate_isolating(items, {}, Config())
    assert [(event, reason.split(":")[0]) for event, reason in failed] == [("e-bad", "power_thermal rules failed")]
    assert [(a.host, a.alertname) for a in result.alerts] == [("h1", "GpuTempNearShutdown")]
    assert set(result.state) == {"h1"}
