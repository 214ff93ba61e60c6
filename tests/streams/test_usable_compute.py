"""Usable compute arithmetic: one node's share by state and health, the fleet's per minute, the minute clock."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from schemas.topics import LIFECYCLE_FLEET, USABLE
from streams import registry

from streams.lifecycle.rules import LifecycleConfig
from streams.lifecycle.usable_compute import SHARE, add_change, changed, fleet_usable, fold, minutes_due, node_share
from streams.runtime.offline import offline_steps
from streams.runtime.spec import Record
from streams.settings import streams_settings

HEALTHY = {"installed_gpus": 8, "present_gpus": 8, "straggler_loss_gpus": 0.0, "throttle_loss_gpus": 0.0,
           "gated": 0.0}


def as_dict(share: list[float]) -> dict:
    return dict(zip(SHARE, share))


@pytest.mark.parametrize("state, bucket", [("drain_requested", "drained"), ("drained", "drained"),
                                           ("repairing", "drained"), ("validating", "validating"),
                                           ("replace", "replace")])
def test_out_of_service_states_count_all_their_gpus_in_one_bucket(state, bucket):
    share = as_dict(node_share(state, HEALTHY))
    assert share["installed"] == share[bucket] == 8 and share["usable"] == 0


def test_a_serving_node_loses_lost_gpus_and_its_performance_losses():
    share = as_dict(node_share("suspect", {**HEALTHY, "present_gpus": 7, "straggler_loss_gpus": 0.0909,
                                           "throttle_loss_gpus": 0.3}))
    assert share == pytest.approx({"installed": 8, "usable": 7 - 0.0909 - 0.3, "drained": 0, "validating": 0,
                                   "replace": 0, "gated": 0, "lost": 1, "straggler_loss": 0.0909, "throttled": 0.3})


def test_a_node_drained_after_its_job_counts_in_use_until_the_bot_reports_it_drained():
    """Through the node step: a suspect's fault (mode after_jobs), the breaker's yes, the bot's drained."""
    [node, _] = offline_steps([registry.STAGES["lifecycle"]], streams_settings(None))
    health = {"host": "h1", "ts": 1_000.0, "score": 92.0, "gates": [], "penalties": [], "job": "job-1",
              "inputs": HEALTHY}
    fault = {"fault_id": "f1", "host": "h1", "gpu_index": 3, "code": "ecc_trend", "bin": "inspect", "rule": "trend_ecc",
             "count": 1, "first_ts": 1_010.0, "last_ts": 1_010.0, "ts": 1_010.0, "evidence": {"mode": "after_jobs"}}
    decision = {"kind": "decision", "proposal_id": "h1:1:p1", "host": "h1", "ts": 1_011.0, "admitted": True,
                "reason": "1 of 3", "event_id": "h1:1:p1:drain"}
    result = {"event_id": "h1:1:p1:drain", "host": "h1", "action": "drain", "ok": True, "ts": 1_300.0}
    shares = []
    for k, (kind, value) in enumerate([("health", health), ("fault", fault), ("decision", decision),
                                       ("health", {**health, "ts": 1_100.0}), ("result", result)]):
        for e in node.run([Record(kind, value, "h1", "t", 0, k, 0)]):
            rec = orjson.loads(e.value)
            if e.to is LIFECYCLE_FLEET and rec["kind"] == "share":
                shares.append((rec["ts"], as_dict(rec["share"])["usable"], as_dict(rec["share"])["drained"]))
    assert shares == [(1_000.0, 8, 0), (1_300.0, 0, 8)]  # in use while its job ran on, out once drained


def test_a_gated_node_still_in_service_is_not_usable():
    share = as_dict(node_share("healthy", {**HEALTHY, "gated": 1.0}))
    assert (share["gated"], share["usable"]) == (8, 0)


def test_fleet_usable_compute_adds_up_to_installed():
    shares = [node_share("healthy", HEALTHY)] * 6 + [
        node_share("repairing", HEALTHY), node_share("validating", HEALTHY),
        node_share("healthy", {**HEALTHY, "straggler_loss_gpus": 0.8, "throttle_loss_gpus": 0.4}),
        node_share("healthy", {**HEALTHY, "present_gpus": 6})]
    uc = fleet_usable(shares, 6_000.0)
    assert (uc["nodes"], uc["installed_gpus"], uc["minute_ts"]) == (10, 80, 6_000.0)
    assert uc["usable_gpus"] == pytest.approx(48 + 6.8 + 6) and uc["schedulable_gpus"] == 62
    assert uc["usable_compute"] == pytest.approx(60.8 / 80)
    assert uc["breakdown"] == pytest.approx({"drained": 0.1, "validating": 0.1, "replace": 0, "gated": 0,
                                            "lost": 0.025, "straggler_loss": 0.01, "throttled": 0.005})
    assert uc["usable_compute"] + sum(uc["breakdown"].values()) == pytest.approx(1.0)


def test_an_empty_fleet_reports_zero_not_a_division_error():
    assert fleet_usable([], 60.0)["usable_compute"] == 0.0


def test_shares_are_sent_only_when_they_move():
    a = node_share("healthy", HEALTHY)
    assert changed(None, a) and not changed(a, node_share("healthy", {**HEALTHY, "throttle_loss_gpus": 0.04}))
    assert changed(a, node_share("healthy", {**HEALTHY, "throttle_loss_gpus": 0.06}))


def test_the_minute_clock_reports_each_completed_minute_once():
    assert minutes_due(None, 6_030.0) == ([], 99)  # the first input starts the clock
    assert minutes_due(99, 6_059.0) == ([], 99)
    assert minutes_due(99, 6_061.0) == ([100], 100)
    assert minutes_due(100, 6_300.0) == ([101, 102, 103, 104], 104)
    assert minutes_due(104, 6_100.0) == ([], 104)  # late input from another partition
    assert minutes_due(0, 60 * 1000.0, max_minutes=3) == ([997, 998, 999], 999)


def test_a_minute_is_reported_only_once_the_clock_is_its_lateness_past_it():
    assert minutes_due(None, 6_150.0, lateness_s=120) == ([], 99)  # the clock starts lateness_s before its first input
    assert minutes_due(99, 6_061.0, lateness_s=120) == ([], 99)
    assert minutes_due(99, 6_180.0, lateness_s=120) == ([100], 100)
    assert minutes_due(100, 6_300.0, lateness_s=120) == ([101, 102], 102)


def test_a_node_s_newest_change_holds_from_its_time_on():
    changes = add_change(add_change([], 50.0, [8, 8]), 130.0, [8, 6])
    assert changes == [[50.0, [8, 8]], [130.0, [8, 6]]]
    # the drain, dated at its proposal (70), came after the health row of 130: the node is out from 70 on
    changes = add_change(changes, 70.0, [8, 0])
    assert changes == [[50.0, [8, 8]], [70.0, [8, 0]]]
    changes = add_change(changes, 70.0, [8, 0, 1])  # a tie: the newer arrival last
    assert fold(changes, 60.0) == ([8, 8], changes[1:])
    assert fold(changes, 120.0) == ([8, 0, 1], [])
    assert fold([], 120.0) == (None, [])


def _fleet_step():
    settings = streams_settings(None, lifecycle=LifecycleConfig(minute_lateness_s=120.0))
    [step] = [s for s in offline_steps([registry.STAGES["lifecycle"]], settings) if s.step.run.__name__ == "fleet_step"]
    return step


def _minutes(arrivals: list[dict]) -> list[tuple]:
    step, out = _fleet_step(), []
    for offset, rec in enumerate(arrivals):
        key = rec.get("host", "fleet")
        for e in step.run([Record("fleet", rec, key, LIFECYCLE_FLEET.name, 0, offset, 0)]):
            if e.to is USABLE:
                uc = orjson.loads(e.value)
                out.append((uc["minute_ts"], uc["nodes"], uc["usable_gpus"]))
    return out


# 4 nodes of 8 GPUs over 10 minutes: each changes its share at times of its own; every record ticks the clock.
EVENTS = sorted([{"kind": "share", "host": f"h{h}", "ts": 6_000.0 + t, "share": [8, u, 8 - u, 0, 0, 0, 0, 0, 0]}
                 for h, changes in enumerate([[(0, 8), (95, 0), (400, 8)], [(1, 8), (130, 4), (131, 8)],
                                              [(2, 8), (250, 0)], [(3, 8), (599, 0)]])
                 for t, u in changes] + [{"kind": "tick", "ts": 6_000.0 + t} for t in range(0, 840, 10)],
                key=lambda r: r["ts"])


@given(st.lists(st.floats(min_value=0, max_value=100), min_size=len(EVENTS), max_size=len(EVENTS)))
@settings(max_examples=60, deadline=None)
def test_each_minute_counts_what_happened_in_it_whatever_the_arrival_order_within_the_lateness(delays):
    """A drain decided after other nodes' later records reached the fleet step (the breaker's round trip, a lagging
    worker) still counts in the minute it happened in: arrivals up to 100 s late (lateness 120 s) change nothing."""
    in_order = _minutes(EVENTS)
    arrival = [r for _, _, r in sorted((r["ts"] + d, i, r) for i, (r, d) in enumerate(zip(EVENTS, delays)))]
    own = {}  # each node's records keep their order (its lifecycle sends them as its state moves): only the
    for r in EVENTS:  # interleaving with other nodes' records and the clock changes
        own.setdefault(r.get("host"), []).append(r)
    late = [own[r.get("host")].pop(0) if r.get("host") else r for r in arrival]
    assert _minutes(late) == in_order
    assert in_order[:3] == [(6_000.0, 4, 32.0), (6_060.0, 4, 24.0), (6_120.0, 4, 24.0)]  # h0 out at 6,095
    assert in_order[-1] == (6_600.0, 4, 16.0) and len(in_order) == 11  # h3 out at 6,599; minute 6,660 ends at
    # 6,720, 120 s before the last record


def test_a_change_later_than_the_lateness_counts_from_the_next_report():
    h2_out = next(r for r in EVENTS if r.get("host") == "h2" and r["ts"] == 6_250.0)
    rest = [r for r in EVENTS if r is not h2_out]
    after = next(i for i, r in enumerate(rest) if r["ts"] == 6_430.0)  # the tick that reports minute 6,240
    in_order, late = dict((m, u) for m, _, u in _minutes(EVENTS)), dict(
        (m, u) for m, _, u in _minutes(rest[:after + 1] + [h2_out] + rest[after + 1:]))
    assert (in_order[6_240.0], in_order[6_300.0]) == (16.0, 16.0)  # h2 out at 6,250
    assert (late[6_240.0], late[6_300.0]) == (24.0, 16.0)  # it came 180 s late: missed its minute, not the next


def test_a_close_reports_every_minute_up_to_the_last_at_once_and_nothing_twice():
    """`up` and `evaluate` send a close when the fleet's clock stops: the minutes the lateness still held back
    (6,660 to 6,780 here, the last record at 6,830) are reported then, not when a next run's records arrive."""
    closed = _minutes([*EVENTS, {"kind": "close", "ts": 6_840.0}])
    assert closed[:11] == _minutes(EVENTS) and [m for m, _, _ in closed[11:]] == [6_660.0, 6_720.0, 6_780.0]
    again = _minutes([*EVENTS, {"kind": "close", "ts": 6_840.0}, {"kind": "close", "ts": 6_840.0},
                      {"kind": "tick", "ts": 6_850.0}])
    assert again == closed  # a close sent twice, and records after it, report no minute again
