"""Sweeps through the real stage code offline (fleetpulse/evaluate/sweep.py): every cell of a small grid per family
of faults decides what the simulator's truth says, and pages within bounds. `python -m fleetpulse.evaluate.sweep
flaps` runs the wide grid (docs/evaluation.md)."""

from __future__ import annotations

import pytest

from fleetpulse.evaluate import straggler_sweep, sweep


def test_sensor_flaps_drain_only_where_the_recurring_problems_policy_says_and_page_at_most_four_times_an_hour():
    # Spells of 15 s to 36 min, 25 % to 90 % of the period hot: the hourly share drains 60 s x 0.9 and 600 s x 0.9,
    # one continuous episode 2,400 s x 0.5 and x 0.9; the rest alert only (docs/remediation.md, "Recurring problems").
    cells = sweep.flaps(periods=(60.0, 600.0, 2400.0), duties=(0.25, 0.5, 0.9), hours=1.25)
    table = sweep.table(cells, max_pages_per_hour=4.0)
    assert all(c.ok(max_pages_per_hour=4.0) for c in cells), table
    assert [c.truth for c in cells] == ["alert", "alert", "drain"] * 2 + ["alert", "drain", "drain"], table
    reasons = [why for c in cells for _, why in c.drains]
    assert any("of the last 60 min" in r for r in reasons) and any("while suspect" in r for r in reasons), table


def test_a_runaway_past_its_dwell_alerts_once_a_shorter_one_raises_nothing_and_any_power_cap_alerts_once():
    cells = sweep.episodes(durations=(20.0, 60.0, 120.0, 600.0))
    table = sweep.episode_table(cells)
    assert all(c.ok(0) for c in cells), table
    assert [c.truth for c in cells] == ["nothing"] + ["alert once"] * 7, table
    assert [c.pages for c in cells] == [0, 1, 1, 1, 0, 0, 0, 0], table  # a power cap is info: never a page
    caps = [c.alerts for c in cells if c.params["kind"] == "power_cap"]
    assert caps == [("GpuPowerLimitReduced",)] * 3 + [("GpuPowerLimitReduced", "GpuSwPowerCap")], table
    short = sweep.run_cell(sweep.episode("power_cap", 5.0), hours=605 / 3600,
                           outcome=sweep.episode_outcome("power_cap", 5.0, 10.0))
    assert short.truth == "alert once or nothing" and short.ok(0)  # truth allows it: a sample may fall inside


def test_a_slow_rank_is_flagged_alone_at_every_job_size_and_position_and_a_minute_of_slowness_raises_nothing():
    cells = straggler_sweep.persistent(pcts=(5.0, 10.0, 30.0), ranks=(16, 512))
    cells += straggler_sweep.episodes(durations=(30.0, 60.0, 120.0), pcts=(10.0, 50.0), world=64)
    table = straggler_sweep.table(cells)
    assert all(c.ok() for c in cells), table
    assert all(c.truth == "straggler" and c.first_flag_s <= 100 for c in cells if c.pct >= 10 and c.duration is None)
    episodes = {c.duration: [] for c in cells if c.duration}
    for c in cells:
        if c.duration:
            episodes[c.duration].append(c.first_flag_s)
    assert episodes[30.0] == episodes[60.0] == [None] * 8 and None not in episodes[120.0], table


def test_outages_drain_only_what_outlasts_its_rule_and_a_single_link_drop_drains_nothing():
    faults = [f for f in sweep.outage_faults(durations=(30.0, 300.0), flaps=(1, 3), every=(60.0,))
              if f["kind"] != "link_degraded"]
    cells = sweep.outages(faults)
    table = sweep.cells_table(cells, max_pages_per_hour=2.0)
    assert all(c.ok(max_pages_per_hour=2.0) for c in cells) and not any(c.pages for c in cells), table
    drained = {(c.params["kind"], c.params.get("duration"), c.params.get("flaps")): bool(c.drains) for c in cells}
    assert drained == {("host_down", 30.0, None): False, ("link_down", 30.0, None): False,
                       ("nic_down", 30.0, None): True,  # its kernel lines say the NIC needs a reboot
                       ("host_down", 300.0, None): True, ("link_down", 300.0, None): True,
                       ("nic_down", 300.0, None): True, ("link_flap", None, 1): False,
                       ("link_flap", None, 3): True}, table


def test_a_job_crashing_again_and_again_drains_nothing_and_escalates_nothing_with_every_rule_on():
    """2 to 20 crashes of one job (each a teardown's Xid 13, 43 and 45 on its 32 GPUs), minutes to hours apart,
    through every stage: the application's, never the hardware's."""
    cells = sweep.crash_loops(crashes=(2, 5, 8, 20), every=(120.0, 1800.0)) + sweep.crash_loops((20,), (3600.0,))
    table = sweep.crash_table(cells)
    assert all(c.ok(0) for c in cells), table
    assert {c.truth for c in cells} == {"alert"} and not any(c.drains or c.escalated or c.pages for c in cells), table
    assert {c.codes for c in cells} == {("xid:13", "xid:43", "xid:45")}, table  # every crash seen, binned software


def test_a_bad_number_list_is_one_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.main(["crashes", "--crashes", "2,x"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert "argument --crashes: '2,x' is not a comma-separated list of int numbers" in err, err
