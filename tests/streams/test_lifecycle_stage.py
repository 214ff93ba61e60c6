"""The lifecycle stage on the stream runtime, once through its two lanes' faust agents: a fault drains through the
fleet step and back."""

from __future__ import annotations


import orjson
import pytest

from core.settings import load
from schemas.analytics import Alert, DrainEvent, FaultEvent, HealthScore, NodeState, RemediationResult
from schemas.codec import encode
from streams.faust_adapter.app import create_app, metrics_of
from streams.groups import app_id
from streams.emit import MemoryEmitter
from schemas.topics import FAULTS, HEALTH, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET, REMEDIATION
from streams.settings import StreamsSettings
from tests.streams.helpers import drain_changelog, put_on, until

PREFIX = "unit."
HEALTH_T, FAULTS_T, RESULTS_T = (PREFIX + t.name for t in (HEALTH, FAULTS, REMEDIATION))
DECISIONS_T = f"{PREFIX}fleetpulse-streams-{LIFECYCLE_DECISIONS.name}"
T0 = 60_000.0 + 30


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX, data_dir=tmp_path)
    app = create_app(settings, stages=["lifecycle"], emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


def node_row(host: str, ts: float, score: float = 100.0, job: str | None = None) -> bytes:
    return encode(HealthScore(ts=ts, host=host, score=score, schedulable=True, job=job, inputs={
        "installed_gpus": 8, "present_gpus": 8, "straggler_loss_gpus": 0.0, "throttle_loss_gpus": 0.0}))


def changelog(emitter, table: str) -> list:
    return [(orjson.loads(s.key), s.partition) for s in drain_changelog(emitter, table)]


async def test_a_fault_drains_through_the_fleet_step_and_results_walk_the_node_on(app, emitter):
    m = metrics_of(app)["lifecycle"]
    fleet_name = LIFECYCLE_FLEET.full(app_id(PREFIX))  # the namespace, not the decisions group
    fault = FaultEvent(fault_id="f1", ts=T0 + 5, host="h1", gpu_index=3, code="xid:79", bin="reboot",
                       rule="catalog", first_ts=T0 + 5, last_ts=T0 + 5)

    def sent(topic: str) -> list:
        return [s for s in emitter.sent if s.topic == topic]

    async with app.agents["lane.decisions"].test_context() as node_stage:
        await put_on(node_stage, HEALTH_T, node_row("h1", T0, job="job-7"), b"h1", 2)
        await put_on(node_stage, HEALTH_T, node_row("h2", T0 + 1, job="job-7"), b"h2", 4)
        await put_on(node_stage, FAULTS_T, encode(fault), b"h1", 2)
        await put_on(node_stage, RESULTS_T, b"\xff", b"h1", 2)
        await until(lambda: m.received == 3 and len(sent(fleet_name)) == 6)
        to_fleet = [orjson.loads(s.value) for s in sent(fleet_name)]
        assert [r["kind"] for r in to_fleet] == ["job", "share", "tick", "job", "share", "drain"]
        assert to_fleet[-1]["repair"] == "reboot" and to_fleet[-1]["evidence"]["code"] == "xid:79"

        async with app.agents["lane.fleet"].test_context() as fleet_stage:
            for s in sent(fleet_name):
                await put_on(fleet_stage, fleet_name, s.value, s.key, 0)
            await until(lambda: any(s.topic.endswith("lifecycle-decisions") for s in emitter.sent))
        [decision] = [s for s in emitter.sent if s.topic.endswith("lifecycle-decisions")]
        assert decision.key == b"h1" and orjson.loads(decision.value)["admitted"] is True
        assert emitter.to(PREFIX + "fleet.drain.events") == []  # the node requests its drain once it knows

        await put_on(node_stage, DECISIONS_T, decision.value, b"h1", 2)
        await until(lambda: len(emitter.to(PREFIX + "fleet.drain.events")) == 1)
        [drain] = [DrainEvent.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.drain.events")]
        assert (drain.host, drain.action, drain.event_id, drain.evidence["repair"]) == ("h1", "drain",
                                                                                         "h1:1:p1:drain", "reboot")
        # what it costs: job-7 runs on both hosts (16 GPUs); a reboot takes h1's 8 for 1 h, and the stopped job
        # loses its 600 s restart and half of a 3,600 s checkpoint interval on all 16
        cost = {k.removeprefix("cost."): v for k, v in drain.evidence.items() if k.startswith("cost.")}
        assert {k: cost[k] for k in ("job", "job_hosts", "job_gpus", "ranks_stopped", "gpus_idled", "gpu_hours",
                                     "gpu_hours_job", "gpu_hours_repair")} == {
            "job": "job-7", "job_hosts": "2", "job_gpus": "16", "ranks_stopped": "8", "gpus_idled": "16",
            "gpu_hours": "18.7", "gpu_hours_job": "10.7", "gpu_hours_repair": "8.0"}
        assert drain.reason == ("fault xid:79 -> reboot (catalog); stops job-7 (16 GPUs on 2 hosts, 8 ranks here): "
                                "~19 GPU-hours at stake (11 of the job's restart and lost work, 8 of reboot)")
        result = RemediationResult(event_id=drain.event_id, host="h1", action="drain", ok=True, ts=T0 + 40)
        await put_on(node_stage, RESULTS_T, encode(result), b"h1", 2)
        await until(lambda: len(emitter.to(PREFIX + "fleet.node.state")) == 3)

    states = [NodeState.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.node.state")]
    assert [(s.host, s.prev_state, s.state) for s in states] == [
        ("h1", "healthy", "drain_requested"), ("h1", "drain_requested", "drained"), ("h1", "drained", "repairing")]
    assert not states[0].schedulable and states[0].evidence["event_id"] == "h1:1:p1:drain"
    requests = [DrainEvent.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.drain.events")]
    assert [(r.action, r.event_id) for r in requests] == [("drain", "h1:1:p1:drain"), ("repair", "h1:1:repair:1")]
    # Refused by the remediation results' validator, counted once; the sink dead-letters it.
    assert emitter.to(PREFIX + "fleet.remediation.results.dlq") == [] and m.errors == 0
    assert metrics_of(app).refused == {RESULTS_T: 1}
    assert app.tables["lifecycle-nodes"]["h1"]["state"] == "repairing"
    assert set(changelog(emitter, "lifecycle-nodes")) == {("h1", 2), ("h2", 4)}


async def test_fleet_step_trips_the_breaker_waits_for_reset_and_reports_usable_compute(app, emitter):
    fleet_name = LIFECYCLE_FLEET.full(app_id(PREFIX))  # the namespace, not the decisions group
    share = [8, 8, 0, 0, 0, 0, 0, 0, 0]
    records = [{"kind": "share", "host": f"h{i}", "ts": T0 + i, "share": share} for i in range(10)]
    records += [{"kind": "drain", "proposal_id": f"h{i}:1:p1", "host": f"h{i}", "ts": T0 + 20 + i, "repair": "reset",
                 "mode": "immediate", "reason": "hard gate", "evidence": {"gates": "gpu0/ecc_dbe"}} for i in range(5)]
    records += [{"kind": "busbw", "host": "h9", "ts": T0 + 30, "gbs": 400.0},
                {"kind": "reset", "ts": T0 + 35, "by": "alice", "note": "checked"},
                {"kind": "tick", "ts": T0 + 125}, {"kind": "nope", "ts": T0 + 126}]
    async with app.agents["lane.fleet"].test_context() as stage:
        for r in records:
            await put_on(stage, fleet_name, orjson.dumps(r), b"fleet", 0)
        await until(lambda: any(s.topic.endswith("usable_compute") for s in emitter.sent)
                    and len(emitter.to(PREFIX + "fleet.drain.events.dlq")) == 1)
    answers = [orjson.loads(s.value) for s in emitter.sent if s.topic.endswith("lifecycle-decisions")]
    assert [(d["host"], d["admitted"]) for d in answers] == [("h0", True), ("h1", True), ("h2", True),
                                                            ("h3", False), ("h4", False)]  # cap: max(3, 5% of 10)
    assert [s.key for s in emitter.sent if s.topic.endswith("lifecycle-decisions")] == [b"h0", b"h1", b"h2", b"h3",
                                                                                        b"h4"]
    alerts = [Alert.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.alerts")]
    assert [(a.alertname, a.status, a.ts - T0) for a in alerts] == [("FleetDrainBreakerOpen", "firing", 23),
                                                                   ("FleetDrainBreakerOpen", "resolved", 35)]
    assert {s.key for s in emitter.to(PREFIX + "fleet.alerts")} == {b"fleet"}
    ucs = [orjson.loads(s.value) for s in emitter.sent if s.topic.endswith("usable_compute")]
    # The clock started in minute 1000; the tick at 60,155 s is 30 s (minute_lateness_s) past minutes 1000 and 1001
    # (drains are decided, not yet reflected: nodes report their new state as a share once their decision reaches
    # them).
    assert [(uc["minute_ts"], uc["nodes"], uc["usable_compute"]) for uc in ucs] == [(60_000.0, 10, 1.0),
                                                                                   (60_060.0, 10, 1.0)]
    breaker = app.tables["lifecycle-fleet"]["breaker"]
    assert (breaker["open"], breaker["trips"], breaker["last_reset"]["by"], breaker["busbw"]) == (
        False, 1, "alice", [[T0 + 30, "h9", 400.0]])
    assert app.tables["lifecycle-fleet"]["decided:h4"][1] is False
    assert {p for _, p in changelog(emitter, "lifecycle-fleet")} == {0}
    assert fleet_name.endswith("fleetpulse-streams-lifecycle-fleet")
