"""Usable compute arithmetic: one node's share by state and health, the fleet's per minute, the minute clock."""

from __future__ import annotations

import pytest

from streams.lifecycle.usable_compute import SHARE, changed, fleet_usable, minutes_due, node_share

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
