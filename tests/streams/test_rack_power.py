"""Unit tests of rack power budgets: sums over hosts, unknown power as a lower bound, stale hosts, replays."""

from __future__ import annotations

import orjson

from schemas.topics import SAMPLES
from schemas.analytics import fingerprint
from streams.power_thermal.rules import GpuRuleConfig, evaluate
from streams.power_thermal.racks import RackConfig, RackState, evaluate_racks
from tests.streams.helpers import gpu, sample

BUDGETS = {"r1": 10_000.0}


def host_samples(host: str, watts: list[float | None], *, rack: str = "r1", t0: float = 1_000.0, unknown: int = 0):
    """Samples every 10 s of an 8-GPU host whose GPUs each draw watts[i] (the first `unknown` GPUs unreadable)."""
    return [sample(host, t0 + 10 * i, [gpu(g, power_w=None if g < unknown else w) for g in range(8)], rack=rack,
                   seq=i) for i, w in enumerate(watts)]


def run(samples, *, budgets=BUDGETS, state=None):
    """Samples -> host stage (rack reports) -> rack stage, like the two faust stages; returns (alerts, state)."""
    result = evaluate([SAMPLES.check(s) for s in sorted(samples, key=lambda s: s["ts"])], {},
                      GpuRuleConfig(rack_budgets_w=budgets))
    reports = result.rack_reports
    alerts, changed = evaluate_racks(reports, state or {}, RackConfig(budgets_w=budgets))
    return alerts, {**(state or {}), **changed}


def named(alerts, name):
    return [(a.status, a.ts) for a in alerts if a.alertname == name]


def test_no_budgets_means_no_rack_reports_and_no_rack_alerts():
    samples = host_samples("h1", [700.0] * 20) + host_samples("h2", [700.0] * 20)
    assert evaluate([SAMPLES.check(s) for s in samples], {}, GpuRuleConfig()).rack_reports == []
    alerts, _ = run(samples, budgets={"other": 1.0})
    assert alerts == []


def test_rack_over_budget_fires_after_dwell_and_resolves_with_hysteresis():
    # 2 hosts x 8 GPUs x 700 W = 11.2 kW on a 10 kW budget, for 100 s; then 2 x 8 x 500 W = 8 kW.
    watts = [700.0] * 10 + [500.0] * 20
    alerts, state = run(host_samples("h1", watts) + host_samples("h2", watts, t0=1_005.0))
    over = [a for a in alerts if a.alertname == "RackPowerOverBudget"]
    # Over from h2's first report (1005) for 30 s; at 1100 h1 drops: 9.6 kW < 10 kW - 3% margin, 120 s later resolved.
    assert [(a.status, a.ts) for a in over] == [("firing", 1_035.0), ("resolved", 1_220.0)]
    assert over[0].value == 11_200.0 and over[0].threshold == 10_000.0 and over[0].rack == "r1"
    assert over[0].host == "" and over[0].gpu_index is None
    assert over[0].evidence["power_w.h1"] == 5_600.0 and over[0].evidence["complete"] == 1.0
    assert over[0].fingerprint == over[1].fingerprint == fingerprint("RackPowerOverBudget", rack="r1")
    # Near (>= 9 kW): resolves only below 8.7 kW, i.e. once h2 dropped too (1105).
    assert named(alerts, "RackPowerNearBudget") == [("firing", 1_065.0), ("resolved", 1_225.0)]
    assert not any(st.firing or st.pending_since for st in state["r1"].alerts.values())  # only flap memory left


def test_unknown_gpu_power_is_a_lower_bound_that_fires_but_never_resolves():
    # h2 cannot read 1 of 8 GPUs: known 4.9 kW + h1 5.6 kW = 10.5 kW >= 10 kW: fires on the lower bound.
    alerts, state = run(host_samples("h1", [700.0] * 10) + host_samples("h2", [700.0] * 10, unknown=1))
    assert named(alerts, "RackPowerOverBudget") == [("firing", 1_030.0)]
    # Later the known part drops under the budget, but h2 still has an unknown GPU: no resolve.
    later = host_samples("h1", [400.0] * 30, t0=1_100.0) + host_samples("h2", [400.0] * 30, t0=1_100.0, unknown=1)
    alerts, state = run(later, state=state)
    assert alerts == [] and state["r1"].alerts["RackPowerOverBudget"].firing


def test_a_silent_host_stops_counting_after_stale_s():
    # h2 reports once at 1000 and goes silent; h1 alone draws 5.6 kW. Both count until h2 is 120 s old (1130),
    # then the complete sum is h1's alone, under budget, and the alert resolves 120 s later.
    alerts, state = run(host_samples("h1", [700.0] * 30) + host_samples("h2", [700.0]))
    assert named(alerts, "RackPowerOverBudget") == [("firing", 1_030.0), ("resolved", 1_250.0)]
    assert set(state["r1"].hosts) == {"h1"}


def test_replayed_reports_and_json_state_change_nothing():
    samples = host_samples("h1", [700.0] * 10) + host_samples("h2", [700.0] * 10)
    alerts, state = run(samples)
    assert named(alerts, "RackPowerOverBudget") == [("firing", 1_030.0)]
    state = {r: RackState.from_json(orjson.loads(orjson.dumps(s.to_json()))) for r, s in state.items()}
    again, _ = run(samples, state=state)
    assert again == []


def test_one_rack_incident_opens_with_the_first_condition_and_closes_with_the_last():
    watts = [700.0] * 10 + [500.0] * 20
    alerts, state = run(host_samples("h1", watts) + host_samples("h2", watts, t0=1_005.0))
    incident = [(a.status, a.ts, a.severity, a.labels["moved_by"]) for a in alerts if a.alertname == "RackIncident"]
    # over budget (critical) at 1035 opens it; near budget (warning) at 1065 joins silently, inhibited; over budget's
    # resolve at 1220 leaves it open at warning (paged no higher again); the near alert's resolve at 1225 closes it
    assert incident == [("firing", 1_035.0, "critical", "RackPowerOverBudget"),
                        ("resolved", 1_225.0, "warning", "RackPowerNearBudget")]
    near = next(a for a in alerts if a.alertname == "RackPowerNearBudget" and a.status == "firing")
    assert near.labels["inhibited_by"] == "RackPowerOverBudget"
    assert near.labels["incident"] == fingerprint("RackIncident", rack="r1")
    assert state["r1"].incident is None
