"""A watchdog for faust 0.15.3's stalled commits: a partition whose first records after its committed offset were
never acknowledged is read again from that offset.

faust commits a partition only up to its first unacknowledged offset. When a worker joins a group that still holds a
dead member (a restart right after a crash), the group rebalances twice; records fetched in between carry the older
generation, the stream skips them unacknowledged, and they are not fetched again. Every later record of that partition
is processed and acknowledged, but its commits stop for good: the lag grows without end and a restart replays from
long ago. Seen at 2,048 hosts with `fleetpulse evaluate --kill-worker-at`, in the code before the runtime too.

The stages drop what they already applied (each keeps per-key watermarks), so reading again from the committed offset
repeats no output; the skipped records themselves are older than what the stages hold by then and are dropped as
stale. Reaches into faust's consumer (`_acked`, `_committed_offset`): faust is pinned (pyproject.toml).
"""

from __future__ import annotations

import logging

import faust
from faust.types import TP

log = logging.getLogger("fleetpulse.streams.runtime")


def head_gap(acked: list[int] | None, committed: int | None) -> tuple[int, int] | None:
    """(committed, first acknowledged) when records right after the committed offset were never acknowledged."""
    if not acked or committed is None:
        return None
    first = min(acked)
    return (committed, first) if first - committed > 1 else None


class GapWatch:
    """Checked every `every_s` (a faust timer): a head gap unchanged over two checks is read again."""

    def __init__(self, app: faust.App):
        self.app = app
        self.seen: dict[TP, tuple[int, int]] = {}
        self.mended = 0

    async def check(self) -> None:
        consumer = self.app.consumer
        gaps = {tp: gap for tp in list(consumer.assignment())
                if (gap := head_gap(consumer._acked.get(tp), consumer._committed_offset.get(tp))) is not None}
        for tp, gap in gaps.items():
            if self.seen.get(tp) != gap:
                continue  # new, or moving: give the records a check's time to arrive on their own
            committed, first = gap
            log.warning("%s[%d]: offsets %d..%d were never delivered and its commits stopped at %d; reading it again "
                        "from there (faust 0.15.3 after a double rebalance)", tp.topic, tp.partition, committed,
                        first - 1, committed)
            await consumer.seek(tp, committed)
            self.mended += 1
        self.seen = {tp: gap for tp, gap in gaps.items() if self.seen.get(tp) != gap}


def watch_offset_gaps(app: faust.App, every_s: float = 15.0) -> GapWatch:
    watch = GapWatch(app)
    app.timer(every_s)(watch.check)
    return watch
