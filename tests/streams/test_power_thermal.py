"""Unit tests of the pure power/thermal rules: dwell, hysteresis, unknown readings, per-device limits, replays."""

from __future__ import annotations

import hashlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.analytics import Alert
from schemas.topics import SAMPLES
from streams.power_thermal.rules import (
    HW_SLOWDOWN, HW_THERMAL, INCIDENT, SW_POWER_CAP, GpuRuleConfig, SubjectState, evaluate, fingerprint,
)
from tests.streams.helpers import gpu, sample, temps_series


def run(samples, *, batch: int = 1, state=None, config: GpuRuleConfig = GpuRuleConfig(), via_json: bool = False):
    """Feed samples in batches of `batch`, carrying state like the stage does; returns (alerts, state)."""
    state = dict(state or {})
    alerts: list[Alert] = []
    for i in range(0, len(samples), batch):
        result = evaluate([SAMPLES.check(s) for s in samples[i:i + batch]], state, config)
        alerts += result.alerts
        state.update(result.state)
        if via_json:  # the faust table stores JSON: a round trip must not change behaviour
            state = {h: SubjectState.from_json(orjson.loads(orjson.dumps(s.to_json()))) for h, s in state.items()}
    return alerts, state


def named(alerts, name):
    return [(a.status, a.ts) for a in alerts if a.alertname == name]


def conditions(alerts):
    """The rules' own alerts, without the GPU incidents over them."""
    return [a for a in alerts if a.alertname != INCIDENT]


def test_fires_after_dwell_not_before():
    # GpuTempSlowdown: >= 89 C for 15 s. Hot from t=1005; samples every 5 s.
    alerts, _ = run(temps_series("h1", [80, 90, 90, 90]))
    assert named(alerts, "GpuTempSlowdown") == []
    alerts, _ = run(temps_series("h1", [80, 90, 90, 90, 90]))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1020.0)]
    fired = next(a for a in alerts if a.alertname == "GpuTempSlowdown")
    assert (fired.starts_at, fired.value, fired.threshold, fired.severity) == (1005.0, 90.0, 89.0, "critical")
    assert fired.gpu_index == 0 and fired.host == "h1" and fired.rack == "r1"
    assert fired.evidence["gpu_temp_c"] == 90.0 and fired.evidence["slowdown_temp_c"] == 89.0
    assert fired.labels["gpu_uuid"] == "GPU-0000"


def test_a_dip_restarts_the_dwell():
    alerts, _ = run(temps_series("h1", [90, 90, 85, 90, 90, 90]))
    assert named(alerts, "GpuTempSlowdown") == []


def test_no_refire_while_firing_and_one_resolve():
    temps = [90] * 40 + [80] * 20
    alerts, state = run(temps_series("h1", temps))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1015.0), ("resolved", 1000.0 + 5 * 52)]
    resolved = [a for a in alerts if a.alertname == "GpuTempSlowdown"][1]
    assert resolved.ends_at == resolved.ts and resolved.starts_at == 1000.0
    kept = state["h1"].alerts["0/GpuTempSlowdown"]  # kept for the flap window: a return would count as a flap
    assert (kept.firing, kept.pending_since, kept.resolved_at, kept.flaps) == (False, None, 1260.0, 0)


def test_a_sensor_flapping_across_the_threshold_keeps_one_alert_firing():
    # 90 s at 90 C, 90 s at 84 C, for an hour (the flapping scenario): without damping every cycle pages.
    temps = ([90] * 18 + [84] * 18) * 20
    alerts, state = run(temps_series("h1", temps))
    slow = [a for a in alerts if a.alertname == "GpuTempSlowdown"]
    # fires, resolves after 60 s cool, fires again within the flap window -> the hold doubles to 120 s > 90 s cool
    assert [a.status for a in slow] == ["firing", "resolved", "firing"]
    assert slow[2].evidence["flaps"] == 1.0 and slow[2].evidence["resolve_s"] == 120.0
    assert state["h1"].alerts["0/GpuTempSlowdown"].firing
    # once the sensor settles below the margin, the longer hold runs out and the alert resolves for good
    alerts, state = run(temps_series("h1", temps + [80] * 30))
    assert [a.status for a in alerts if a.alertname == "GpuTempSlowdown"] == ["firing", "resolved", "firing",
                                                                             "resolved"]


def test_flap_memory_expires_after_the_window():
    temps = [90] * 18 + [84] * 400 + [90] * 18  # 2,000 s apart: a new episode, not a flap
    alerts, state = run(temps_series("h1", temps))
    slow = [a for a in alerts if a.alertname == "GpuTempSlowdown"]
    assert [a.status for a in slow] == ["firing", "resolved", "firing"] and slow[2].evidence["flaps"] == 0.0


def test_hysteresis_resolves_only_below_threshold_minus_margin():
    # slowdown 89, margin 3: 87 C (inside the band) for minutes never resolves.
    alerts, _ = run(temps_series("h1", [90] * 5 + [87] * 40))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1015.0)]
    # 85 C (< 86) for 60 s resolves; 55 s does not.
    alerts, _ = run(temps_series("h1", [90] * 5 + [85] * 12))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1015.0)]
    alerts, _ = run(temps_series("h1", [90] * 5 + [85] * 13))
    assert named(alerts, "GpuTempSlowdown")[-1] == ("resolved", 1085.0)


def test_flapping_within_the_margin_does_not_flap_alerts():
    temps = [90] * 5 + [88, 90] * 30 + [87.5, 89.2] * 30
    alerts, _ = run(temps_series("h1", temps))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1015.0)]
    # Flapping across the threshold faster than the dwell never fires at all.
    alerts, _ = run(temps_series("h1", [90, 88] * 40))
    assert named(alerts, "GpuTempSlowdown") == []


def test_unknown_readings_never_fire_or_resolve():
    alerts, _ = run(temps_series("h1", [None] * 30))
    assert alerts == []
    # Firing, then the sensor goes unknown for long: no resolve (None is not 0 C).
    alerts, state = run(temps_series("h1", [90] * 5 + [None] * 40))
    assert named(alerts, "GpuTempSlowdown") == [("firing", 1015.0)]
    assert state["h1"].alerts["0/GpuTempSlowdown"].firing
    # Unknown limits: a hot GPU whose slowdown limit cannot be read does not fire on it.
    no_limit = [sample("h1", 1000.0 + 5 * i, [gpu(0, 95.0, slowdown_temp_c=None)]) for i in range(10)]
    alerts, _ = run(no_limit)
    assert named(alerts, "GpuTempSlowdown") == [] and named(alerts, "GpuTempNearShutdown") != []
    # Power unknown while a power alert fires: it stays firing.
    over = [sample("h1", 1000.0 + 5 * i, [gpu(0, power_w=760.0 if i < 10 else None)]) for i in range(40)]
    alerts, _ = run(over)
    assert named(alerts, "GpuPowerOverLimit") == [("firing", 1030.0)]


def test_long_unobserved_gap_restarts_the_dwell():
    # Hot at t=0, unknown for 200 s (> max_gap 120 s), hot again: the dwell counts from the new reading.
    alerts, _ = run(temps_series("h1", [90] + [None] * 40 + [90, 90]))
    assert named(alerts, "GpuTempSlowdown") == []


def test_limits_are_per_device():
    readings = [gpu(0, 85.0), gpu(1, 85.0, slowdown_temp_c=80.0, gpu_max_op_temp_c=78.0, shutdown_temp_c=90.0)]
    samples = [sample("h1", 1000.0 + 5 * i, readings, seq=i) for i in range(20)]
    alerts, _ = run(samples)
    assert {(a.alertname, a.gpu_index) for a in conditions(alerts)} == {("GpuTempSlowdown", 1), ("GpuTempHigh", 1)}
    assert next(a for a in alerts if a.alertname == "GpuTempSlowdown").threshold == 80.0


def test_hbm_and_power_limits():
    samples = [sample("h1", 1000.0 + 5 * i, [gpu(0, hbm_temp_c=94.0), gpu(1, power_w=700.0),
                                              gpu(2, power_w=740.0)]) for i in range(20)]
    alerts, _ = run(samples)
    assert {(a.alertname, a.gpu_index, a.status) for a in conditions(alerts)} == {
        ("HbmTempHigh", 0, "firing"), ("GpuPowerOverLimit", 2, "firing")}


def test_throttle_bits_with_their_own_dwell():
    bits = HW_SLOWDOWN | HW_THERMAL | SW_POWER_CAP
    samples = [sample("h1", 1000.0 + 5 * i, [gpu(0, throttle_reasons=bits if i < 40 else 0)]) for i in range(80)]
    alerts, _ = run(samples)
    assert named(alerts, "GpuHwThermalSlowdown") == [("firing", 1010.0), ("resolved", 1000.0 + 5 * 52)]
    assert named(alerts, "GpuHwSlowdown")[0] == ("firing", 1010.0)
    assert named(alerts, "GpuSwPowerCap") == []  # 195 s < its 300 s dwell
    assert named(alerts, "GpuHwPowerBrake") == []


def test_an_enforced_limit_under_the_default_alerts_at_once_and_resolves_when_restored():
    # A cap from 700 W to 400 W for 60 s (nvidia-smi -pl, a BMC): no dwell, unlike the 300 s of GpuSwPowerCap.
    limits = [700.0] * 4 + [400.0] * 12 + [700.0] * 20
    samples = [sample("h1", 1000.0 + 5 * i, [gpu(0, power_limit_w=w, power_default_limit_w=700.0, power_w=380.0),
                                              gpu(1, power_limit_w=690.0, power_default_limit_w=700.0),
                                              gpu(2, power_limit_w=400.0, power_w=380.0)], seq=i)
               for i, w in enumerate(limits)]
    alerts, _ = run(samples)
    assert named(alerts, "GpuPowerLimitReduced") == [("firing", 1020.0), ("resolved", 1080.0 + 60.0)]
    fired = next(a for a in alerts if a.alertname == "GpuPowerLimitReduced")
    assert fired.gpu_index == 0 and fired.severity == "info" and named(alerts, INCIDENT) == []
    assert "enforced 400 W, default 700 W" in fired.summary  # 690 W (1.4 % under) and no default known: nothing
    assert fired.evidence["power_limit_w"] == 400.0 and fired.evidence["power_default_limit_w"] == 700.0


def test_fingerprint_is_stable_and_shared_by_firing_and_resolved():
    alerts, _ = run(temps_series("h1", [90] * 5 + [80] * 20))
    firing, resolved = [a for a in alerts if a.alertname == "GpuTempSlowdown"]
    assert firing.fingerprint == resolved.fingerprint == fingerprint("GpuTempSlowdown", host="h1", gpu_index=0)
    # The documented identity, hashed without Python's per-process hash(): stable across processes and releases.
    assert firing.fingerprint == hashlib.sha256(b"GpuTempSlowdown|host=h1|gpu=0|rack=").hexdigest()[:16]
    assert len({fingerprint("GpuTempSlowdown", host="h1", gpu_index=i) for i in range(8)}) == 8
    assert fingerprint("A", host="h1", gpu_index=1) != fingerprint("A", host="h11")


def test_replayed_samples_do_not_refire_after_resolve():
    samples = temps_series("h1", [90] * 5 + [80] * 20)
    alerts, state = run(samples)
    assert len(conditions(alerts)) == 4  # slowdown and near-shutdown fire and resolve
    again, _ = run(samples[3:], state=state)  # at-least-once replay of an uncommitted tail
    assert again == []


def test_batching_and_json_state_do_not_change_the_result():
    samples = (temps_series("h1", [90] * 8 + [84] * 16 + [91] * 6) + temps_series("h2", [70, 92, 92, 93] * 6)
               + [sample("h3", 1000.0 + 5 * i, [gpu(0, throttle_reasons=HW_SLOWDOWN)]) for i in range(10)])
    one, _ = run(sorted(samples, key=lambda s: s["ts"]))
    for batch in (7, 50, len(samples)):
        many, _ = run(samples, batch=batch, via_json=True)
        assert sorted(a.model_dump_json() for a in many) == sorted(a.model_dump_json() for a in one)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(70, 95)), min_size=1, max_size=60), st.integers(1, 20))
def test_alerts_alternate_and_batching_never_matters(temps, batch):
    samples = temps_series("h1", temps)
    alerts, _ = run(samples, batch=batch)
    alone, _ = run(samples)
    assert [a.model_dump_json() for a in alerts] == [a.model_dump_json() for a in alone]
    for name in {a.alertname for a in conditions(alerts)}:
        statuses = [s for s, _ in named(alerts, name)]
        assert statuses == ["firing", "resolved"] * (len(statuses) // 2) + ["firing"] * (len(statuses) % 2)
    # The incident: opened, then fired again only at a higher severity (an escalation), until it resolves.
    severities = {"info": 0, "warning": 1, "critical": 2, "page": 3}
    level = -1
    for a in (a for a in alerts if a.alertname == INCIDENT):
        if a.status == "firing":
            assert severities[a.severity] > level
            level = severities[a.severity]
        else:
            assert level >= 0
            level = -1
    open_conditions = sum(1 if a.status == "firing" else -1 for a in conditions(alerts))
    assert (level >= 0) == (open_conditions > 0)  # an incident is open exactly while a condition fires


def test_one_incident_per_gpu_pages_once_escalates_once_and_resolves_with_its_last_condition():
    # 88 C from t=1000: GpuTempHigh (87, 60 s dwell) at 1060; 90 C from 1100: GpuTempSlowdown (89, 15 s) at 1115,
    # GpuTempNearShutdown (shutdown 92 - 2 = 90, no dwell) at 1100; back to 80 C from 1200.
    temps = [88] * 20 + [90] * 20 + [80] * 60
    alerts, state = run(temps_series("h1", temps))
    incident = [(a.status, a.ts, a.severity, a.labels["moved_by"]) for a in alerts if a.alertname == INCIDENT]
    assert incident[:2] == [("firing", 1060.0, "warning", "GpuTempHigh"),
                            ("firing", 1100.0, "page", "GpuTempNearShutdown")]  # opened, then escalated once
    assert incident[2][0] == "resolved" and len(incident) == 3  # the slowdown joining under a page: no new page
    fp = fingerprint(INCIDENT, host="h1", gpu_index=0)
    assert {a.fingerprint for a in alerts if a.alertname == INCIDENT} == {fp}
    slowdown = next(a for a in alerts if a.alertname == "GpuTempSlowdown" and a.status == "firing")
    assert slowdown.labels["incident"] == fp and slowdown.labels["inhibited_by"] == "GpuTempNearShutdown"
    escalated = next(a for a in alerts if a.alertname == INCIDENT and a.severity == "page")
    assert escalated.summary.startswith("h1 GPU 0: GpuTempNearShutdown (page), GpuTempHigh (warning); escalated "
                                        "from warning by GpuTempNearShutdown")
    resolved = [a for a in alerts if a.alertname == INCIDENT][-1]
    last = max(a.ts for a in conditions(alerts) if a.status == "resolved")
    assert (resolved.ts, resolved.ends_at, resolved.starts_at) == (last, last, 1000.0)
    assert state["h1"].incidents == {}


def test_incidents_are_the_same_whatever_the_batches_and_through_json_state():
    temps = [88] * 20 + [90] * 20 + [80] * 30 + [91] * 10 + [80] * 40
    whole, _ = run(temps_series("h1", temps))
    for batch in (1, 3, 7, 200):
        alerts, _ = run(temps_series("h1", temps), batch=batch, via_json=True)
        assert [(a.alertname, a.status, a.ts, a.severity, a.labels.get("inhibited_by")) for a in alerts] == \
            [(a.alertname, a.status, a.ts, a.severity, a.labels.get("inhibited_by")) for a in whole]


def test_a_chronic_warning_keeps_the_incident_open_and_each_critical_return_pages_again():
    # Power over its limit for the whole run (GpuPowerOverLimit, warning); two hot spells at 89.5 C (slowdown only).
    temps = [80] * 20 + [89.5] * 10 + [80] * 40 + [89.5] * 10 + [80] * 40
    samples = [sample("h1", 1000.0 + 5 * i, [gpu(0, t, power_w=740.0)], seq=i) for i, t in enumerate(temps)]
    alerts, state = run(samples)
    pages = [(a.status, a.severity, a.labels["moved_by"]) for a in alerts if a.alertname == INCIDENT]
    assert pages == [("firing", "warning", "GpuPowerOverLimit"), ("firing", "critical", "GpuTempSlowdown"),
                     ("firing", "critical", "GpuTempSlowdown")]  # the second spell pages again, the power goes on
    assert state["h1"].incidents["0"]["paged"] == "warning"


def test_info_conditions_alone_page_nobody():
    samples = [sample("h1", 1000.0 + 5 * i, [gpu(0, throttle_reasons=SW_POWER_CAP)], seq=i) for i in range(80)]
    alerts, state = run(samples)
    assert named(alerts, "GpuSwPowerCap") == [("firing", 1300.0)] and named(alerts, INCIDENT) == []
    assert alerts[0].labels["incident"] == fingerprint(INCIDENT, host="h1", gpu_index=0)
    assert state["h1"].incidents["0"] == {"conditions": {"GpuSwPowerCap": "info"}, "open_since": None, "paged": None}


def test_host_state_from_before_incidents_counts_its_firing_conditions_as_paged():
    _, before = run(temps_series("h1", [90] * 10))  # slowdown and near-shutdown firing
    legacy = {"h1": SubjectState.from_json({k: v for k, v in before["h1"].to_json().items() if k != "incidents"})}
    assert legacy["h1"].incidents is None
    alerts, state = run(temps_series("h1", [90] * 10 + [80] * 40, t0=1050.0), state=legacy)
    assert named(alerts, INCIDENT) == [("resolved", max(a.ts for a in alerts))]  # no second page, one resolve
    assert state["h1"].incidents == {}
