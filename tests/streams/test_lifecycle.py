"""Lifecycle state machine: every transition, hysteresis, dwell, software faults, validation, escalation, flapping."""

from __future__ import annotations

import orjson
import pytest

from schemas.analytics import DrainEvent
from streams.health import rules as health
from streams.health.stage import news
from streams.lifecycle.breaker import Breaker, BreakerConfig, decide
from streams.lifecycle.rules import LifecycleConfig, Node, on_decision, on_fault, on_health, on_result
from tests.streams.helpers import gpu, sample

CFG = LifecycleConfig()
T0 = 100_000.0


class Fleet:
    """Pure lifecycle nodes wired to the pure breaker the way the two stages wire them through Kafka."""

    def __init__(self, known: int = 100, cfg: LifecycleConfig = CFG, bcfg: BreakerConfig = BreakerConfig()):
        self.cfg, self.bcfg, self.known = cfg, bcfg, known
        self.nodes: dict[str, Node] = {}
        self.breaker, self.decided = Breaker(), {}
        self.states, self.requests, self.alerts, self.reports, self.decisions = [], [], [], [], []
        self.busbw = (0.0, 0)

    def node(self, host: str) -> Node:
        return self.nodes.setdefault(host, Node())

    def apply(self, host: str, out) -> None:
        self.states += out.states
        self.requests += out.requests
        self.reports += out.reports
        for p in out.proposals:
            v = decide(self.breaker, p, self.decided.get(host), self.known, self.bcfg)
            if self.busbw[1]:
                v.decision.update(busbw_median_gbs=self.busbw[0], busbw_n=self.busbw[1])
            self.decided[host] = v.decided
            self.decisions.append(v.decision)
            self.alerts += [v.alert] if v.alert else []
            self.apply(host, on_decision(self.node(host), host, v.decision, self.cfg))

    def health(self, host: str, ts: float, score: float, gates: dict[str, float] | None = None, **inputs) -> None:
        gates = gates or {}
        row = {"host": host, "ts": ts, "score": score, "gates": sorted(gates), "penalties": [],
               "inputs": {"installed_gpus": 8, "present_gpus": 8, **inputs,
                          **{f"gate_since.{g}": t for g, t in gates.items()}}}
        self.apply(host, on_health(self.node(host), host, row, self.cfg))

    def fault(self, host: str, ts: float, bin_: str, code: str = "xid:79", fid: str | None = None) -> None:
        f = {"fault_id": fid or f"{host}/{code}/{ts}", "host": host, "gpu_index": 3, "code": code, "bin": bin_,
             "rule": "catalog", "count": 1, "first_ts": ts, "last_ts": ts, "ts": ts, "evidence": {"line": "Xid"}}
        self.apply(host, on_fault(self.node(host), host, f, self.cfg))

    def result(self, host: str, ts: float, action: str, ok: bool = True, event_id: str | None = None, **measured):
        if event_id is None:
            event_id = [r for r in self.requests if r.host == host and r.action == action][-1].event_id
        r = {"event_id": event_id, "host": host, "action": action, "ok": ok, "ts": ts, "detail": "",
             "measurements": measured}
        self.apply(host, on_result(self.node(host), host, r, self.cfg))

    def path(self, host: str) -> list[str]:
        return [s.state for s in self.states if s.host == host and s.state != s.prev_state]

    def actions(self, host: str) -> list[str]:
        return [r.action for r in self.requests if r.host == host]


def low_for(f: Fleet, host: str, t0: float, seconds: float, score: float = 50.0, step: float = 60.0) -> float:
    t = t0
    while t <= t0 + seconds:
        f.health(host, t, score)
        t += step
    return t - step


def test_suspect_only_after_the_score_stays_low_for_the_enter_dwell():
    f = Fleet()
    f.health("h1", T0, 100.0)
    f.health("h1", T0 + 60, 50.0)
    f.health("h1", T0 + 120, 50.0)
    f.health("h1", T0 + 150, 61.0)  # just above the threshold: the low stretch is broken
    f.health("h1", T0 + 200, 50.0)
    f.health("h1", T0 + 300, 50.0)
    assert f.path("h1") == []
    f.health("h1", T0 + 320, 50.0)
    [st] = f.states
    assert (st.state, st.prev_state, st.since, st.schedulable) == ("suspect", "healthy", T0 + 320, True)
    assert "below 60 for 120s" in st.reason


def test_suspect_recovers_only_above_the_exit_threshold_after_exit_and_minimum_dwell():
    f = Fleet()
    end = low_for(f, "h1", T0, 120)
    assert f.path("h1") == ["suspect"]
    for k in range(1, 20):  # 74 is above the enter threshold but not above the exit one: still suspect
        f.health("h1", end + 60 * k, 74.0)
    assert f.path("h1") == ["suspect"] and f.node("h1").below_s == 0  # the low episode ended at the first 74
    t = end + 60 * 20
    for k in range(6):  # over 75 for 300 s: now also past the 600 s minimum dwell
        f.health("h1", t + 60 * k, 90.0)
    assert f.path("h1") == ["suspect", "healthy"]


def test_minimum_dwell_holds_a_soft_move_after_a_transition():
    f = Fleet()
    low_for(f, "h1", T0, 120)
    for k in range(1, 10):  # above 75 for 300 s from T0+180 on, but less than 600 s into suspect
        f.health("h1", T0 + 120 + 60 * k, 95.0)
    assert f.path("h1") == ["suspect"]
    f.health("h1", T0 + 120 + 600, 95.0)
    assert f.path("h1") == ["suspect", "healthy"] and f.states[-1].since == T0 + 720


def test_suspect_below_the_threshold_long_enough_is_drained_after_jobs():
    f = Fleet()
    end = low_for(f, "h1", T0, 120)
    low_for(f, "h1", end + 60, 600)
    assert f.path("h1") == ["suspect", "drain_requested"]
    [drain] = [r for r in f.requests if r.action == "drain"]
    assert (drain.evidence["mode"], drain.evidence["repair"]) == ("after_jobs", "inspect")
    assert drain.event_id == "h1:1:p1:drain" and "while suspect" in drain.reason


def test_a_drain_after_the_job_is_asked_again_now_when_the_gpu_then_fails_hard():
    """The bot waits for the job before draining a suspect; an uncorrectable error that follows must not wait: one
    new drain request, mode immediate (Slurm requeues the job, Kubernetes evicts), the heavier repair kept; a second
    hard fault asks nothing more, and the bot's answer to the new request drains the node."""
    f = Fleet()
    end = low_for(f, "h1", T0, 120)
    end = low_for(f, "h1", end + 60, 600)
    f.fault("h1", end + 30, "reset", code="ecc_dbe")
    f.fault("h1", end + 40, "reboot", code="xid:79")
    first, urgent = [r for r in f.requests if r.action == "drain"]
    assert first.evidence["mode"] == "after_jobs" and urgent.evidence["mode"] == "immediate"
    assert urgent.evidence["resend_of"] == first.event_id and urgent.evidence["repair"] == "inspect"
    assert urgent.reason.startswith("now, not after the job: fault ecc_dbe -> reset"), urgent.reason
    f.result("h1", end + 60, "drain", event_id=urgent.event_id)
    assert f.path("h1")[-3:] == ["drain_requested", "drained", "repairing"]


def test_a_hard_gate_drains_at_once_without_dwell_and_old_gates_do_not():
    f = Fleet()
    f.health("h1", T0, 100.0)
    f.health("h1", T0 + 5, 20.0, {"gpu2/ecc_dbe": T0 + 5})
    assert f.path("h1") == ["drain_requested"] and f.states[0].since == T0 + 5
    assert f.requests[0].evidence["gates"] == "gpu2/ecc_dbe" and f.requests[0].evidence["repair"] == "reset"
    g = Fleet()
    g.node("h1").repaired_at, g.node("h1").returned_at = T0 - 40, T0
    g.health("h1", T0 + 10, 20.0, {"gpu2/row_remap_pending": T0 - 50})  # fired before the last repair
    assert g.path("h1") == [] and g.requests == []


@pytest.mark.parametrize("code", ["xid:13", "xid:31", "xid:43", "xid:45"])
@pytest.mark.parametrize("bin_", ["retry", "ignore"])
def test_software_only_faults_never_drain(code, bin_):
    f = Fleet()
    f.health("h1", T0, 100.0)
    for k in range(50):
        f.fault("h1", T0 + k, bin_, code=code)
    assert f.states == [] and f.requests == [] and f.decisions == []


@pytest.mark.parametrize("bin_, repair", [("reset", "reset"), ("reboot", "reboot"), ("inspect", "inspect")])
def test_fault_bins_drain_then_repair_validate_and_return(bin_, repair):
    f = Fleet()
    f.health("h1", T0, 100.0)
    f.fault("h1", T0 + 1, bin_)
    f.fault("h1", T0 + 1, bin_)  # the same fault again (a replay): one proposal
    assert f.path("h1") == ["drain_requested"] and len(f.decisions) == 1
    f.result("h1", T0 + 60, "drain")
    assert f.path("h1")[1:] == ["drained", "repairing"] and f.actions("h1") == ["drain", "repair"]
    assert f.requests[-1].evidence["fault.line"] == "Xid" and repair in f.requests[-1].reason
    assert (f.requests[-1].evidence["repair"], f.requests[-1].evidence["mode"]) == (repair, "immediate")
    f.result("h1", T0 + 600, "repair")
    validate = f.requests[-1]
    assert f.path("h1")[-1] == "validating" and validate.action == "validate"
    assert validate.requirements == {"dcgm_diag_level": CFG.dcgm_level[repair]}  # no fleet median yet
    f.result("h1", T0 + 900, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)
    assert f.path("h1")[-1] == "healthy" and f.actions("h1")[-1] == "undrain"
    assert f.reports == [{"kind": "busbw", "host": "h1", "ts": T0 + 900, "gbs": 410.0},
                         {"kind": "back", "host": "h1", "ts": T0 + 900}]  # an incident of its domain may end
    n = f.node("h1")
    assert (n.returned_at, n.cause, n.request, n.episode) == (T0 + 900, None, None, 1)
    f.health("h1", T0 + 910, 20.0, {"gpu3/fault_bin:" + bin_: T0 + 1})  # the health gate of the fault just fixed
    assert f.path("h1")[-1] == "healthy"


def test_a_tray_admitted_under_its_domain_s_incident_names_it_on_every_request():
    """The fleet step's decision names the incident (streams/lifecycle/domains.py); the drain, the repair and the
    validation all carry it, so a bot repairs the domain's shared part once for all of its trays."""
    f = Fleet()
    f.health("h1", T0, 100.0)
    n = f.node("h1")
    out = on_fault(n, "h1", {"fault_id": "x", "host": "h1", "gpu_index": None, "code": "fabric_failed",
                             "bin": "reboot", "rule": "gpu_link", "count": 8, "first_ts": T0 + 1, "last_ts": T0 + 1,
                             "ts": T0 + 1, "evidence": {"domain": "c1/7"}}, CFG)
    [proposal] = out.proposals  # answered as the fleet step answers a tray of an open incident (stage._domain_drain)
    f.apply("h1", on_decision(n, "h1", {"proposal_id": proposal["proposal_id"], "admitted": True, "event_id": "h1:1:drain:1",
                                        "ts": T0 + 2, "reason": "part of NVLink domain c1/7's incident",
                                        "incident": "c1/7", "incident_since": "100010", "incident_hosts": "5"}, CFG))
    f.result("h1", T0 + 60, "drain", event_id="h1:1:drain:1")
    f.result("h1", T0 + 900, "repair")
    assert [r.action for r in f.requests] == ["drain", "repair", "validate"]
    assert {(r.evidence["incident"], r.evidence["incident_since"]) for r in f.requests} == {("c1/7", "100010")}


def test_replace_bin_takes_the_replace_path_and_validates_the_new_card_hardest():
    f = Fleet()
    f.fault("h1", T0, "replace", code="row_remap_failure")
    f.result("h1", T0 + 30, "drain")
    assert f.path("h1") == ["drain_requested", "drained", "replace"] and f.actions("h1") == ["drain", "replace"]
    f.result("h1", T0 + 86_400, "replace")
    assert f.path("h1")[-1] == "validating" and f.requests[-1].requirements["dcgm_diag_level"] == 4


def test_validation_checks_bandwidth_against_the_fleet_median_and_escalates_after_r_failures():
    f = Fleet()
    f.busbw = (400.0, 12)  # the breaker's median of passed validations, carried on the drain decision
    f.fault("h1", T0, "reset")
    f.result("h1", T0 + 10, "drain")
    f.result("h1", T0 + 20, "repair")
    assert f.requests[-1].requirements == {"dcgm_diag_level": 3, "nccl_busbw_min_gbs": 360.0}
    f.result("h1", T0 + 30, "validate", dcgm_diag_level=3, nccl_busbw_gbs=350.0)
    assert f.path("h1")[-2:] == ["validating", "repairing"] and f.actions("h1")[-1] == "repair"
    assert "nccl_busbw_gbs 350.0 below required 360" in f.states[-1].reason
    f.result("h1", T0 + 40, "repair")
    f.result("h1", T0 + 50, "validate", ok=False, dcgm_diag_level=3)
    assert f.path("h1")[-1] == "replace" and f.actions("h1")[-1] == "replace"
    assert len({r.event_id for r in f.requests}) == len(f.requests)  # every request has its own id
    f.result("h1", T0 + 60, "replace")
    f.result("h1", T0 + 70, "validate", dcgm_diag_level=4, nccl_busbw_gbs=390.0)
    assert f.path("h1")[-1] == "healthy" and f.node("h1").validation_failures == 0


def test_missing_dcgm_level_fails_validation():
    f = Fleet()
    f.fault("h1", T0, "reboot")
    f.result("h1", T0 + 10, "drain")
    f.result("h1", T0 + 20, "repair")
    f.result("h1", T0 + 30, "validate")
    assert f.path("h1")[-1] == "repairing" and "dcgm_diag_level missing" in f.states[-1].reason


def test_repeated_repair_failures_escalate_to_replace():
    f = Fleet()
    f.fault("h1", T0, "reset")
    f.result("h1", T0 + 10, "drain")
    f.result("h1", T0 + 20, "repair", ok=False)
    assert f.path("h1")[-1] == "repairing"
    f.health("h1", T0 + 20 + CFG.retry_s, 20.0)  # the next input after retry_s re-sends the repair
    assert f.actions("h1")[-2:] == ["repair", "repair"] and f.requests[-1].evidence["attempt"] == "2"
    f.result("h1", T0 + 200, "repair", ok=False)
    assert f.path("h1")[-1] == "replace" and f.actions("h1")[-1] == "replace"


def test_stale_or_unexpected_results_are_ignored():
    f = Fleet()
    f.fault("h1", T0, "reboot")
    f.result("h1", T0 + 5, "repair", event_id="h1:1:repair:9")  # not what drain_requested waits for
    f.result("h1", T0 + 6, "drain", event_id="h1:0:drain:1")  # an older episode
    assert f.path("h1") == ["drain_requested"]


def test_an_unanswered_request_is_sent_again_after_the_timeout():
    f = Fleet()
    f.fault("h1", T0, "reboot")
    f.health("h1", T0 + CFG.request_timeout_s["drain"] - 1, 20.0)
    assert f.actions("h1") == ["drain"]
    f.health("h1", T0 + CFG.request_timeout_s["drain"], 20.0)
    assert f.actions("h1") == ["drain", "drain"] and f.requests[-1].event_id == "h1:1:drain:1"
    assert f.requests[-1].evidence["resend_of"] == "h1:1:p1:drain"
    f.result("h1", T0 + CFG.request_timeout_s["drain"] + 5, "drain")  # the answer to the re-sent request counts
    assert f.path("h1")[-1] == "repairing"


def test_a_hard_fault_during_validation_fails_it():
    f = Fleet()
    f.fault("h1", T0, "reboot")
    f.result("h1", T0 + 10, "drain")
    f.result("h1", T0 + 20, "repair")
    f.fault("h1", T0 + 25, "reset", code="xid:48")
    assert f.path("h1")[-2:] == ["validating", "repairing"] and "fault during validation" in f.states[-1].reason


def test_a_replace_fault_while_repairing_switches_to_the_replace_path():
    f = Fleet()
    f.fault("h1", T0, "reboot")
    f.result("h1", T0 + 10, "drain")
    f.fault("h1", T0 + 15, "replace", code="xid:48")
    assert f.path("h1")[-1] == "replace" and f.actions("h1")[-1] == "replace"


def test_a_node_record_survives_the_changelog_mid_flow():
    f = Fleet()
    f.fault("h1", T0, "reset")
    f.result("h1", T0 + 10, "drain")
    f.nodes["h1"] = Node.from_json(orjson.loads(orjson.dumps(f.node("h1").to_json())))  # a restarted worker
    f.result("h1", T0 + 20, "repair")
    f.result("h1", T0 + 30, "validate", dcgm_diag_level=3)
    assert f.path("h1") == ["drain_requested", "drained", "repairing", "validating", "healthy"]
    assert all(isinstance(r, DrainEvent) for r in f.requests)


@pytest.mark.parametrize("period_s, expect_changes", [(180.0, 0), (360.0, 1), (2400.0, 2)])
def test_a_sensor_flapping_around_its_threshold_moves_at_most_once_per_dwell_window(period_s, expect_changes):
    """A GPU crossing its slowdown limit every period/2 (throttling while hot), through the real health core. Hot
    spells of 3 minutes make the node suspect and never add up to a drain; spells of 20 minutes are one continuous
    episode past the drain dwell each (docs/remediation.md, "Recurring problems")."""
    hcfg, h, f = health.HealthConfig(), health.HostHealth(), Fleet()
    for k in range(int(3 * 3600 / 10)):
        t = T0 + 10 * k
        hot = (t - T0) % period_s < period_s / 2
        temp, bits = (95.0, 0x40) if hot else (80.0, 0)
        health.apply_sample(h, sample("h1", t, [gpu(i, temp if i == 0 else 60.0, throttle_reasons=bits if i == 0
                                                     else 0) for i in range(8)]), hcfg)
        for row in news(h, health.score(h, "h1", t, hcfg), hcfg):
            if row.gpu_index is None:
                f.health("h1", row.ts, row.score, {g: row.inputs[f"gate_since.{g}"] for g in row.gates})
    changes = [s for s in f.states if s.state != s.prev_state]
    assert len(changes) == expect_changes
    assert all(b.since - a.since >= CFG.min_dwell_s for a, b in zip(changes, changes[1:]))
    assert sum(r.action == "drain" and "resend_of" not in r.evidence for r in f.requests) <= 1


def test_a_node_low_most_of_the_hour_in_short_spells_is_drained_for_inspection_once():
    f = Fleet()
    for k in range(6 * 60):  # 50 s at 40, 10 s at 90, every minute for an hour: no spell near the drain dwell
        f.health("h1", T0 + 10 * k, 90.0 if k % 6 == 5 else 40.0)
    [drain] = [r for r in f.requests if r.action == "drain"]
    assert drain.evidence["repair"] == "inspect" and drain.evidence["mode"] == "after_jobs"
    assert "of the last 60 min" in drain.reason and "a recurring problem" in drain.reason, drain.reason
    assert float(drain.evidence["low_s"]) > 0.75 * 3600 and drain.ts - T0 < 3600


def test_time_out_of_service_does_not_count_toward_the_hourly_share_after_a_return():
    f = Fleet()
    for k in range(6 * 60):  # drained for inspection by the hourly share, as above
        f.health("h1", T0 + 10 * k, 90.0 if k % 6 == 5 else 40.0)
    t = T0 + 3600
    f.result("h1", t, "drain")
    f.result("h1", t + 10, "repair")
    for k in range(1, 360):  # an hour of validation (burn-in), its score low throughout
        f.health("h1", t + 10 + 10 * k, 30.0)
    f.result("h1", t + 3610, "validate", dcgm_diag_level=3, nccl_busbw_gbs=400.0)
    assert f.path("h1")[-1] == "healthy"
    f.health("h1", t + 3620, 40.0)
    f.health("h1", t + 3630, 40.0)
    assert [r.action for r in f.requests if r.ts > t + 3610] == [], f.requests[-1]


def test_the_hourly_share_never_replaces_the_cause_of_a_drain_waiting_for_the_breaker():
    n = Node(low_log=[[T0 - 3500, T0]], score=40.0, score_ts=T0, initial=False, since=T0 - 7200)
    fault = {"fault_id": "f1", "host": "h1", "gpu_index": 3, "code": "xid:119", "bin": "reset", "rule": "catalog",
             "count": 1, "first_ts": T0 + 5, "last_ts": T0 + 5, "ts": T0 + 5, "evidence": {"line": "Xid 119"}}
    on_fault(n, "h1", fault, CFG)
    cause = dict(n.proposal["cause"])
    assert (cause["repair"], cause["mode"]) == ("reset", "immediate")
    on_health(n, "h1", {"host": "h1", "ts": T0 + 10, "score": 40.0, "gates": [], "penalties": [], "inputs": {}}, CFG)
    assert n.proposal["cause"] == cause


def test_spells_below_the_hourly_share_never_drain():
    f = Fleet()
    for k in range(3 * 6 * 60):  # 40 s low of every minute for three hours: 67 % of each hour
        f.health("h1", T0 + 10 * k, 90.0 if k % 6 >= 4 else 40.0)
    assert [r for r in f.requests if r.action == "drain"] == [] and f.node("h1").state in ("healthy", "suspect")


def drained_and_repaired(f: Fleet, host: str = "h1") -> None:
    """h1 drained for a recovery action its GPU 3 reported, repaired at T0 + 600, now validating."""
    f.health(host, T0, 100.0)
    f.health(host, T0 + 5, 20.0, {"gpu3/recovery_action:gpu_reset": T0 + 5})
    f.result(host, T0 + 60, "drain")
    f.result(host, T0 + 600, "repair")
    assert f.path(host)[-1] == "validating"


def test_a_gate_still_present_after_the_repair_fails_validation_and_keeps_the_node_out():
    """The repair did not clear it: the health stage, which restarts a gate's onset at a repair, still reports it on
    the first sample after. A passing diag does not return a node whose own health row says gated."""
    f = Fleet()
    drained_and_repaired(f)
    f.health("h1", T0 + 610, 20.0, {"gpu3/recovery_action:gpu_reset": T0 + 605})
    f.result("h1", T0 + 900, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)
    assert f.path("h1")[-1] == "repairing" and f.actions("h1")[-1] == "repair"
    assert "health still gates it: gpu3/recovery_action:gpu_reset" in f.states[-1].reason
    f.result("h1", T0 + 1200, "repair")
    f.health("h1", T0 + 1210, 20.0, {"gpu3/recovery_action:gpu_reset": T0 + 1205})  # still there after this one
    f.result("h1", T0 + 1500, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)  # second failure
    assert f.path("h1")[-1] == "replace" and f.node("h1").state == "replace"
    assert not any(s.schedulable for s in f.states if s.ts > T0)


def test_a_gate_that_cleared_after_the_repair_lets_validation_pass():
    f = Fleet()
    drained_and_repaired(f)
    f.health("h1", T0 + 610, 100.0)  # the first row after the repair: no gate
    f.result("h1", T0 + 900, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)
    assert f.path("h1")[-1] == "healthy" and f.actions("h1")[-1] == "undrain"


def test_a_row_from_before_the_repair_does_not_fail_validation():
    """Rows lag: the last row the node step has seen may still carry the gate the repair dealt with."""
    f = Fleet()
    drained_and_repaired(f)
    f.result("h1", T0 + 900, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)
    assert f.path("h1")[-1] == "healthy"


def test_a_gate_from_after_the_repair_that_arrives_after_the_return_drains_again():
    """The row that shows the gate still there came after the validation result: the node is out again at once."""
    f = Fleet()
    drained_and_repaired(f)
    f.result("h1", T0 + 900, "validate", dcgm_diag_level=4, nccl_busbw_gbs=410.0)
    assert f.path("h1")[-1] == "healthy"
    f.health("h1", T0 + 905, 20.0, {"gpu3/recovery_action:gpu_reset": T0 + 605})
    assert f.path("h1")[-1] == "drain_requested"
    assert "gpu3/recovery_action:gpu_reset" in f.requests[-1].reason


def test_a_node_record_from_before_repaired_at_was_kept_keeps_its_old_gates_dealt_with():
    old = {k: v for k, v in Node(state="healthy", returned_at=T0).to_json().items() if k not in ("repaired_at", "gates")}
    assert Node.from_json(old).repaired_at == T0


def cycle(f: Fleet, host: str, t: float, bin_: str = "reset") -> None:
    """One whole cycle: a fault in `bin_`, drained, repaired, validated, returned (an hour end to end)."""
    f.fault(host, t, bin_, fid=f"{host}/{t}")
    f.result(host, t + 60, "drain")
    if f.path(host)[-1] == "replace":
        return
    f.result(host, t + 600, "repair")
    f.result(host, t + 900, "validate", dcgm_diag_level=4)


def test_the_k_th_drain_for_the_same_repair_within_the_window_goes_to_replace_and_stops_cycling():
    f = Fleet()
    for k in range(CFG.max_cycles - 1):
        cycle(f, "h1", T0 + k * 3600)
        assert f.path("h1")[-1] == "healthy"
    assert f.actions("h1") == ["drain", "repair", "validate", "undrain"] * (CFG.max_cycles - 1)
    cycle(f, "h1", T0 + 10 * 3600)
    drain = [r for r in f.requests if r.action == "drain"][-1]
    assert drain.evidence["repair"] == "replace" and drain.evidence["recurring_repair"] == "reset"
    assert drain.evidence["recurrence"] == str(CFG.max_cycles)
    assert drain.reason.startswith(f"repeat offender: drain {CFG.max_cycles} for reset within 168 h")
    assert f.path("h1")[-3:] == ["drain_requested", "drained", "replace"] and f.actions("h1")[-1] == "replace"
    f.result("h1", T0 + 11 * 3600, "replace")
    f.result("h1", T0 + 12 * 3600, "validate", dcgm_diag_level=4)
    assert f.path("h1")[-1] == "healthy" and f.node("h1").returns == [[T0 + 12 * 3600, "replace"]]
    cycle(f, "h1", T0 + 13 * 3600)  # the new part's first reset: a cycle of its own again
    assert f.path("h1")[-1] == "healthy"


def test_returns_outside_the_window_or_for_another_repair_do_not_count():
    f = Fleet(cfg=LifecycleConfig(max_cycles=2, cycles_window_s=7200))
    cycle(f, "h1", T0, "reset")
    cycle(f, "h1", T0 + 2 * 3600, "reboot")  # another repair: its own count
    assert f.path("h1")[-1] == "healthy"
    cycle(f, "h1", T0 + 5 * 3600, "reset")  # the first reset's return is 4.75 h back, past the window
    assert f.path("h1")[-1] == "healthy"
    cycle(f, "h1", T0 + 6 * 3600, "reset")  # one reset return 45 min back: the 2nd within the window
    assert f.path("h1")[-1] == "replace"


def test_a_node_record_from_before_the_recurrence_rule_reads_as_no_returns():
    raw = Node().to_json()
    del raw["returns"]
    assert Node.from_json(raw).returns == []


def test_a_node_record_from_a_later_version_is_read_without_its_new_fields():
    raw = {**Node(state="drained", episode=4).to_json(), "field_from_the_future": [1, 2]}
    node = Node.from_json(raw)
    assert (node.state, node.episode) == ("drained", 4)
