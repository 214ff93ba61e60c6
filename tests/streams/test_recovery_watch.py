"""The table-recovery watchdog (streams/runtime/recovery.py): a recovery with records left that has received none for
longer than the limit is stalled; one that is moving, done, or not running is not."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from streams.runtime.recovery import recovery_stall, stalled
from tests.conftest import REPO


def test_a_recovery_that_received_nothing_since_it_started_stalls_after_the_limit():
    assert stalled(12, started_at=100.0, events_at=[], now=159.0, limit_s=60) is None
    assert stalled(12, started_at=100.0, events_at=[], now=161.0, limit_s=60) == 61.0


def test_the_newest_record_of_any_partition_counts_as_progress():
    assert stalled(12, started_at=100.0, events_at=[101.0, 150.0], now=209.0, limit_s=60) is None
    assert stalled(12, started_at=100.0, events_at=[101.0, 150.0], now=211.0, limit_s=60) == 61.0


def test_a_recovery_with_nothing_left_or_not_started_never_stalls():
    assert stalled(0, started_at=100.0, events_at=[], now=1_000.0, limit_s=60) is None
    assert stalled(5, started_at=None, events_at=[], now=1_000.0, limit_s=60) is None


def recovering(in_recovery: bool, remaining: dict, started_at: float | None, events: dict) -> SimpleNamespace:
    """The attributes of faust 0.15.3's Recovery that the watchdog reads."""
    recovery = SimpleNamespace(in_recovery=in_recovery, active_remaining=lambda: remaining,
                               _recovery_started_at=started_at, _active_events_received_at=events)
    return SimpleNamespace(tables=SimpleNamespace(recovery=recovery))


def test_the_app_s_recovery_is_read_only_while_it_runs():
    assert recovery_stall(recovering(True, {"a": 7}, 10.0, {"a": 20.0}), now=90.0, limit_s=60) == (70.0, 7)
    assert recovery_stall(recovering(True, {"a": 7}, 10.0, {"a": 40.0}), now=90.0, limit_s=60) is None
    assert recovery_stall(recovering(False, {"a": 7}, 10.0, {}), now=900.0, limit_s=60) is None


def test_a_rebalance_starts_the_wait_again():
    assert recovery_stall(recovering(True, {"a": 7}, 10.0, {}), now=90.0, limit_s=60, rebalanced_at=50.0) is None
    assert recovery_stall(recovering(True, {"a": 7}, 10.0, {}), now=120.0, limit_s=60, rebalanced_at=50.0) == (70, 7)


def test_a_partition_read_past_its_mark_does_not_hide_another_s_stall():
    assert recovery_stall(recovering(True, {"a": -3, "b": 2}, 10.0, {}), now=90.0, limit_s=60) == (80.0, 2)


def test_faust_s_recovery_still_has_what_the_watchdog_reads():
    from faust.tables import recovery

    assert {"in_recovery", "active_remaining", "_set_recovery_started"} <= set(dir(recovery.Recovery))
    assert "_recovery_started_at = monotonic()" in inspect.getsource(recovery.Recovery._set_recovery_started)
    assert "active_events_received_at[tp] = now" in inspect.getsource(recovery)  # in _slurp_changelogs, per event
    assert recovery.monotonic is time.monotonic


@pytest.mark.integration
def test_a_worker_whose_recovery_stalls_stops_with_exit_1(settings_env, tmp_path):
    """The wiring, on the real broker: the watchdog runs from start-up (faust's timers start only after the first
    recovery) and stops the worker with exit 1. The stall is stood in for by the watchdog's own reading of faust's
    bookkeeping (a real one comes about once in 18 handovers, tests/streams/test_scale_out.py)."""
    script = ("import sys, streams.runtime.recovery as r; r.recovery_stall = lambda *a, **k: (61.0, 3); "
              "from streams.cli import main; sys.exit(main(['--worker', 'telemetry', '--stages', 'fault_bins']))")
    log = tmp_path / "worker.log"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          stdout=log.open("wb"), stderr=subprocess.STDOUT, timeout=120)
    text = log.read_text()
    assert proc.returncode == 1, text[-3000:]
    assert "table recovery received no changelog record for 61s with 3 left to read" in text
    print(f"\nstopped with exit 1 {time.monotonic() - started:.1f} s after it was started")
