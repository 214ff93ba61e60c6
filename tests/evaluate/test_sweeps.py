"""Sweeps through the real stage code offline (fleetpulse/evaluate/sweep.py): every cell of a small grid per family
of faults decides what the simulator's truth says, and pages within bounds. `python -m fleetpulse.evaluate.sweep
flaps` runs the wide grid (docs/evaluation.md)."""

from __future__ import annotations

from fleetpulse.evaluate import sweep


def test_sensor_flaps_drain_only_where_the_recurring_problems_policy_says_and_page_at_most_four_times_an_hour():
    # Spells of 15 s to 36 min, 25 % to 90 % of the period hot: the hourly share drains 60 s x 0.9 and 600 s x 0.9,
    # one continuous episode 2,400 s x 0.5 and x 0.9; the rest alert only (docs/remediation.md, "Recurring problems").
    cells = sweep.flaps(periods=(60.0, 600.0, 2400.0), duties=(0.25, 0.5, 0.9), hours=1.25)
    table = sweep.table(cells, max_pages_per_hour=4.0)
    assert all(c.ok(max_pages_per_hour=4.0) for c in cells), table
    assert [c.truth for c in cells] == ["alert", "alert", "drain"] * 2 + ["alert", "drain", "drain"], table
    reasons = [why for c in cells for _, why in c.drains]
    assert any("of the last 60 min" in r for r in reasons) and any("while suspect" in r for r in reasons), table


def test_a_runaway_or_a_power_cap_past_its_dwell_alerts_once_and_a_shorter_one_raises_nothing():
    cells = sweep.episodes(durations=(20.0, 120.0, 600.0))
    table = sweep.episode_table(cells)
    assert all(c.ok(0) for c in cells), table
    assert [c.truth for c in cells] == ["nothing", "alert once", "alert once", "nothing", "nothing", "alert once"]
    assert [c.pages for c in cells] == [0, 1, 1, 0, 0, 0], table  # a power cap is info: a condition, never a page
