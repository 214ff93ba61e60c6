"""A watchdog for faust 0.15.3's table recovery that stops receiving changelog records.

Seen with two telemetry workers in one group (tests/streams/test_scale_out.py, once in about 18 runs): when one leaves,
the other's recovery of the partitions it takes over logs "Resuming flow..." and then receives no record of any
changelog partition, its own included, for as long as it runs ("No event received for active tp ... since recovery
start"), so the worker processes nothing. A fresh worker recovers the same changelogs at start-up, so the worker stops
(exit 1, like a crashed stage) once recovery has had records left and received none for
FLEETPULSE_STREAMS_RECOVERY_STALL_S, counted from the recovery's start, its newest record or the last rebalance,
whichever is latest, and its supervisor starts it again. A recovery that is slow but moving is left alone. Reads
faust's Recovery bookkeeping (`_recovery_started_at`, `_active_events_received_at`, `active_remaining`, all on
faust's time.monotonic clock): faust is pinned.
"""

from __future__ import annotations

from collections.abc import Iterable


def stalled(remaining: int, started_at: float | None, events_at: Iterable[float], now: float,
            limit_s: float) -> float | None:
    """Seconds the recovery has gone without a changelog record while `remaining` records are left to read, if that is
    over `limit_s`; else None. `events_at`: when each partition last received one, or anything else that counts as a
    fresh start (a rebalance), on the clock of `now`."""
    if remaining <= 0 or started_at is None:
        return None
    idle = now - max([started_at, *events_at])
    return idle if idle > limit_s else None


def recovery_stall(app, now: float, limit_s: float, rebalanced_at: float = 0.0) -> tuple[float, int] | None:
    """(seconds without a record, records left) of the app's table recovery, if it has stalled."""
    recovery = app.tables.recovery
    if not recovery.in_recovery:
        return None
    remaining = sum(max(n, 0) for n in recovery.active_remaining().values())  # a partition read past its mark: 0
    events = [*getattr(recovery, "_active_events_received_at", {}).values(), rebalanced_at]
    idle = stalled(remaining, getattr(recovery, "_recovery_started_at", None), events, now, limit_s)
    return None if idle is None else (idle, remaining)
