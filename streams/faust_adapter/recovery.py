"""A watchdog for faust 0.15.3's table recovery that stops receiving changelog records.

Seen with two telemetry workers in one group (tests/streams/test_scale_out.py, once in about 18 runs): when one leaves,
the other's recovery of the partitions it takes over logs "Resuming flow..." and then receives no record of any
changelog partition, its own included, for as long as it runs ("No event received for active tp ... since recovery
start"), so the worker processes nothing. A fresh worker recovers the same changelogs at start-up, so the worker stops
(exit 1, like a crashed stage) once recovery has had records left and received none for
FLEETPULSE_STREAMS_RECOVERY_STALL_S, counted from the recovery's start, its newest record or the last rebalance,
whichever is latest, and its supervisor starts it again. A recovery that is slow but moving is left alone. Before
that, ReRead reads the stuck changelog partitions again (FLEETPULSE_STREAMS_RECOVERY_REREAD_S, below). Reads faust's
Recovery bookkeeping (`_recovery_started_at`, `_active_events_received_at`, `active_remaining`, `active_offsets`, all
on faust's time.monotonic clock): faust is pinned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger("fleetpulse.streams.runtime")


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
    idle = stalled(remaining, getattr(recovery, "_recovery_started_at", None), _news(recovery, rebalanced_at), now,
                   limit_s)
    return None if idle is None else (idle, remaining)


def _news(recovery, rebalanced_at: float) -> list[float]:
    return [*getattr(recovery, "_active_events_received_at", {}).values(), rebalanced_at]


def stuck_partitions(app) -> dict:
    """The recovery's active changelog partitions with records left, each with where to read it again from: the
    record after its last applied one (its first where it applied none). Not the applied record itself, where
    recovery's own seek goes: fetched again, recovery would skip it but count it as news, and a stall that never
    ends would look like one that moves."""
    recovery = app.tables.recovery
    offsets = recovery.active_offsets
    return {tp: max(offsets[tp] + 1, 0) for tp, left in recovery.active_remaining().items()
            if left > 0 and tp in offsets}


class ReRead:
    """Before the watchdog gives up on a stalled recovery: once per stall, after `after_s` without a record, log what
    the consumer holds of the stuck changelog partitions and seek each back to the record after its last applied one.

    Why: faust 0.15.3's getmany drops the records it fetched when the group's generation changes while it hands them
    out, or when their partition is not active at that moment, and the fetch position has moved past them; on a
    stream topic that lost records (streams/faust_adapter/delivery.py reads them again), and a changelog partition whose
    records recovery waits for would wait for ever. The seek goes to the record after the last one applied, where
    recovery would read on anyway (should it land while recovery is still setting up, recovery's own seek comes after
    it): if records then come, recovery goes on without the worker's restart; if none do, the watchdog stops the worker
    at FLEETPULSE_STREAMS_RECOVERY_STALL_S as before (at most `most` re-reads per recovery, so a stall that records
    keep breaking and resuming still ends in the stop). The logged rows (fetch position, high watermark, paused) say
    which it was. A value of `after_s` at or above the stall limit leaves the stop alone. Whatever fails in here is
    logged and leaves the stop to the watchdog."""

    seek_timeout_s = 15.0
    most = 3

    def __init__(self, app, after_s: float, report=None, metrics=None):
        self.app, self.after_s, self.report, self.metrics = app, after_s, report, metrics  # metrics: MetricsRegistry
        self.done_for: float | None = None  # the start of the stall read again (its last record, start or rebalance)
        self.count: tuple[float | None, int] = (None, 0)  # re-reads since the recovery's start

    async def check(self, now: float, rebalanced_at: float = 0.0) -> dict | None:
        """The partitions read again now, if any."""
        try:
            return await self._check(now, rebalanced_at)
        except Exception as exc:  # noqa: BLE001 - a diagnostic and a retry: never in the way of the stop
            log.warning("reading a stalled recovery's changelog partitions again failed: %r", exc)
            return None

    async def _check(self, now: float, rebalanced_at: float) -> dict | None:
        recovery = self.app.tables.recovery
        stall = recovery_stall(self.app, now, self.after_s, rebalanced_at)
        if stall is None:
            return None
        started = getattr(recovery, "_recovery_started_at", None)
        since = max([started, *_news(recovery, rebalanced_at)])  # the start `stalled` counted from (a stall has one)
        if self.done_for == since:
            return None
        self.done_for = since
        n = self.count[1] if self.count[0] == started else 0
        if n >= self.most:
            return None
        targets = stuck_partitions(self.app)
        if not targets:
            return None
        self.count = (started, n + 1)
        shown = self.report(self.app, targets) if self.report is not None else ""
        log.warning("table recovery received no changelog record for %.0fs with %d left to read: reading %s again "
                    "from the record after the last applied one\n%s", *stall,
                    ", ".join(f"{tp.topic}[{tp.partition}]@{offset}" for tp, offset in sorted(targets.items())),
                    shown)
        await asyncio.wait_for(self.app.consumer.seek_wait(targets), timeout=self.seek_timeout_s)
        if self.metrics is not None:
            self.metrics.recovery_rereads += 1
        return targets
