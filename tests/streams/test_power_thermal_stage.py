"""The power/thermal stage on the stream runtime: its pure step, isolation of a record the rules choke on, and once
through the telemetry lane's faust agent (refusals counted once, state on the source partition, rack re-keying)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from core.settings import load
from schemas.analytics import Alert
from schemas.codec import encode
from schemas.topics import ALERTS, RACK_POWER, SAMPLES
from streams.faust_adapter.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.power_thermal import stage as pt
from streams.power_thermal.racks import RackConfig
from streams.power_thermal.rules import GpuRuleConfig
from streams.runtime.lane import Wired, run_step
from streams.runtime.spec import Record
from streams.runtime.state import StepState
from streams.settings import StreamsSettings
from tests.streams.helpers import drain_changelog, gpu, put_on, sample, temps_series, until

PREFIX = "unit."
SAMPLES_TOPIC, RACKS_TOPIC = PREFIX + SAMPLES.name, f"{PREFIX}fleetpulse-streams-{RACK_POWER.name}"
CFG = pt.PowerThermalConfig(GpuRuleConfig(rack_budgets_w={"r1": 3_000.0}), RackConfig(budgets_w={"r1": 3_000.0}))


def records(samples: list[dict], partition: int = 3) -> list[Record]:
    return [Record("sample", SAMPLES.check(s), s["host"], SAMPLES_TOPIC, partition, i, 0) for i, s in enumerate(samples)]


def test_the_step_alerts_keeps_host_state_and_forwards_rack_power():
    state = StepState({"hosts": {}, "racks": {}}, {"h1": 3})
    out = pt.step(records(temps_series("h1", [90] * 5)), state, CFG)
    alerts = [Alert.model_validate_json(e.value) for e in out if e.to is ALERTS]
    assert [(a.alertname, a.status, a.gpu_index) for a in alerts] == [
        ("GpuTempNearShutdown", "firing", 0), ("GpuIncident", "firing", 0), ("GpuTempSlowdown", "firing", 0)]
    assert all(e.log and e.log.startswith("firing ") for e in out if e.to is ALERTS)
    reports = [orjson.loads(e.value) for e in out if e.to is RACK_POWER]
    assert len(reports) == 5 and {r["rack"] for r in reports} == {"r1"}
    assert list(state.writes) == [("hosts", "h1")] and state.get("hosts", "h1")["wm"] == 1_020.0


def test_rack_reports_fire_the_rack_budget_alert():
    reports = [Record("rack_report", pt.check_report({"rack": "r1", "host": h, "ts": 1_000.0 + 10 * i,
                                                      "power_w": 1_600.0, "complete": True}), "r1", RACKS_TOPIC, 2,
                      2 * i + k, 0)
               for i in range(6) for k, h in enumerate(("h1", "h2"))]
    state = StepState({"hosts": {}, "racks": {}}, {"r1": 2})
    alert, incident = [Alert.model_validate_json(e.value) for e in pt.step(reports, state, CFG)]
    assert (alert.alertname, alert.status, alert.rack, alert.value, alert.ts) == (
        "RackPowerOverBudget", "firing", "r1", 3_200.0, 1_030.0)
    assert (incident.alertname, incident.status, incident.rack, incident.severity) == (
        "RackIncident", "firing", "r1", "critical")
    assert alert.labels["incident"] == incident.fingerprint
    assert state.get("racks", "r1")["alerts"]["RackPowerOverBudget"][1] is True
    assert state.get("racks", "r1")["incident"]["conditions"] == {"RackPowerOverBudget": "critical"}


def test_a_record_the_rules_choke_on_is_isolated_not_the_batch():
    good = temps_series("h1", [95.0, 95.0])
    bad = SAMPLES.check(sample("h2", 1_000.0, [gpu(0, 95.0)]))
    bad["gpus"][0]["gpu_temp_c"] = "hot"  # got past the validator somehow: the rules raise on it
    recs = records(good[:1]) + [Record("sample", bad, "h2", SAMPLES_TOPIC, 5, 9, 0)] + records(good[1:])
    w = Wired(pt.STAGE, pt.STAGE.steps[0], CFG, {"hosts": {}, "racks": {}}, None, None)
    emits, state, failed = run_step(w, recs)
    assert [(r.key, reason.split(":")[0]) for r, reason in failed] == [("h2", "power_thermal rules failed")]
    assert {Alert.model_validate_json(e.value).host for e in emits if e.to is ALERTS} == {"h1"}
    assert {key for _, key in state.writes} == {"h1"}  # the choked record's half-made state is gone


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX,
                    data_dir=tmp_path, streams_batch_within_s=0.05, rack_budgets_w={"r1": 3_000.0},
                    stages=["power_thermal"])
    app = create_app(settings, emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


async def test_the_lane_decodes_once_refuses_once_and_keeps_co_partitioned_state(app, emitter):
    metrics = metrics_of(app)
    h1 = temps_series("h1", [90] * 5 + [80] * 20)  # fires and resolves on GPU 0
    h2 = temps_series("h2", [60] * 25, t0=1_001.0)  # never alerts
    async with app.agents["lane.telemetry"].test_context() as lane:
        await put_on(lane, SAMPLES_TOPIC, b"\x00 not json", b"h9", 6)
        for a, b in zip(h1, h2):  # interleaved: each batch mixes partitions 3 and 5
            await put_on(lane, SAMPLES_TOPIC, encode(a), b"h1", 3)
            await put_on(lane, SAMPLES_TOPIC, encode(b), b"h2", 5)
        await put_on(lane, RACKS_TOPIC, b"{}", b"r1", 2)  # not a report: the worker's own record, dead-lettered
        await until(lambda: metrics["power_thermal"].received == 50 and len(emitter.to(PREFIX + ALERTS.name)) >= 4)
        await asyncio.sleep(0.2)  # nothing more may follow

    alerts = [Alert.model_validate_json(s.value) for s in emitter.to(PREFIX + ALERTS.name)]
    assert [(a.alertname, a.status, a.host, a.gpu_index) for a in alerts] == [
        ("GpuTempNearShutdown", "firing", "h1", 0), ("GpuIncident", "firing", "h1", 0),
        ("GpuTempSlowdown", "firing", "h1", 0), ("GpuTempNearShutdown", "resolved", "h1", 0),
        ("GpuTempSlowdown", "resolved", "h1", 0), ("GpuIncident", "resolved", "h1", 0)]
    m = metrics["power_thermal"]
    assert (m.emitted, m.errors) == (6, 1) and m.batches >= 1  # errors: the broken rack report
    assert metrics.refused == {SAMPLES_TOPIC: 1, RACKS_TOPIC: 1}  # once per record, however many stages read it
    assert emitter.to(SAMPLES_TOPIC + ".dlq") != [] and len(emitter.to(SAMPLES_TOPIC + ".dlq")) == 1
    assert orjson.loads(emitter.to(SAMPLES_TOPIC + ".dlq")[0].value)["source_topic"] == RACKS_TOPIC  # not the sample

    table = app.tables["power_thermal-hosts"]
    assert table["h1"]["wm"] == h1[-1]["ts"]
    assert all(not firing and pending is None for pending, firing, *_ in table["h1"]["alerts"].values())
    changelog = drain_changelog(emitter, "power_thermal-hosts")
    assert changelog and {(orjson.loads(m.key), m.partition) for m in changelog} == {("h1", 3)}  # h2 never moved
    reports = emitter.to(RACKS_TOPIC)
    assert len(reports) == 50 and {s.key for s in reports} == {b"r1"}
