"""A watchdog for faust 0.15.3's stalled commits: a partition whose records after its committed offset were delivered
but never acknowledged is read again from that offset.

faust commits a partition only up to its first unacknowledged offset. Around a rebalance (a restart right after a
crash: the group still holds the dead member, or the first fetch races the assignment), records fetched under the
older generation are skipped by the stream unacknowledged and not fetched again. If later records of the partition
arrive they are processed, but its commits stop for good (the lag grows without end, a restart replays from long
ago); if none arrive, the skipped ones are simply never processed: a fault or a remediation result lost. Seen at
2,048 hosts with `fleetpulse evaluate --kill-worker-at` (old code included) and in the lifecycle restart test.

The stages drop what they already applied (each keeps per-key watermarks), so reading again from the committed offset
repeats no output; the skipped records themselves are older than what the stages hold by then and are dropped as
stale. Reaches into faust's consumer (`_acked`, `_committed_offset`, `_read_offset`): faust is pinned (pyproject.toml).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from weakref import WeakSet

import faust
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

log = logging.getLogger("fleetpulse.streams.runtime")


async def rewind_uncommitted(consumer, committed: Mapping, reads: Callable[[str], bool]) -> list:
    """Seek the partitions of topics the streams read (`reads`: faust's acks_enabled_for, as GapWatch asks; no
    changelog, which the tables' recovery seeks itself) whose group has committed nothing (or offset 0) to their
    first record.

    faust re-reads what it dropped around a rebalance (getmany discards records fetched while the flow is stopped, or
    for a partition not active yet) by seeking every partition to its committed offset. aiokafka's seek_to_committed
    seeks only to offsets above 0, so a partition nothing was committed on stays where the dropped fetch left it and
    those records are never read: a worker restarted before its first commit on an internal topic lost the rack power
    reports there (faust 0.15.3, aiokafka 0.12; tests/streams/test_offset_gaps.py)."""
    fresh = [tp for tp, offset in committed.items() if not offset and reads(tp.topic)]
    if fresh:
        await consumer.seek_to_beginning(*fresh)
    return fresh


class RewindingConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = await super().seek_to_committed()
        await self.call_thread(rewind_uncommitted, self._ensure_consumer(), committed,
                               self.app.topics.acks_enabled_for)
        return committed


class RewindingConsumer(faust_kafka.Consumer):
    """faust's consumer whose seek back to committed offsets also rewinds partitions with nothing committed, and which
    never commits past a record a lane's crashed batch left unprocessed (`held`, set by delivery.abandon): the worker
    stops after such a crash (streams/runtime/lane.py), and its last commit must leave that record to the next one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held: dict[TP, int] = {}  # partition -> the first record a crashed batch left, until it is acknowledged
        self.abandoned: WeakSet = WeakSet()  # records a crashed lane left that another lane still holds
        # the fetch loop's (delivery.jump): the last record handed out per partition since its last seek, and where
        # the loop itself went back to until a record of the partition comes
        self.delivered: dict[TP, int] = {}
        self.rewound: dict[TP, int] = {}

    async def seek(self, partition: TP, offset: int) -> None:
        await super().seek(partition, offset)
        self.delivered.pop(partition, None)  # what is read next is `offset` itself
        self.rewound.pop(partition, None)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        self.delivered.clear()
        self.rewound.clear()

    def _new_consumer_thread(self) -> RewindingConsumerThread:
        return RewindingConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def hold(self, tp: TP, offset: int) -> None:
        self.held[tp] = min(offset, self.held.get(tp, offset))

    def _new_offset(self, tp: TP) -> int | None:
        held = self.held.get(tp)
        if held is not None:
            committed = self._committed_offset.get(tp)
            if held in self._acked_index[tp] or (committed is not None and committed > held):
                del self.held[tp]  # read again and acknowledged, or read by the group's member that committed it
            else:
                return None
        return super()._new_offset(tp)


def stall(acked: list[int] | None, committed: int | None, read: int | None, end: int | None) -> tuple[int, int] | None:
    """(offset to read again from, the offset it is stuck before) when a partition's commits cannot move:

    - a head gap: records right after the committed offset were never acknowledged, later ones were;
    - skipped delivery: the partition holds records past its committed offset (`end`, its high watermark), faust
      handed them to its streams (`read`, the last one handed out, is past the commit) and none was acknowledged, nor
      will a later one show it (a partition without new records); or it never handed any out (`read` None).
    A partition with nothing past its commit (`end` = committed) is not stuck, however faust's read offset reads."""
    base = committed or 0
    if acked:
        first = min(acked)
        return (base, first) if committed is not None and first - committed > 1 else None
    if end is not None and end > base and (read is None or read >= base):
        return (base, end)  # handed out and never acknowledged, or (two checks apart) never handed out at all
    return None


def _end(consumer, tp: TP) -> int | None:
    try:
        return consumer.highwater(tp)
    except Exception:  # noqa: BLE001 - not known yet (no fetch since the assignment)
        return None


class GapWatch:
    """Checked every `every_s` (a faust timer): a stall unchanged over two checks is read again."""

    def __init__(self, app: faust.App):
        self.app = app
        self.seen: dict[TP, tuple[int, int]] = {}
        self.mended = 0

    async def check(self) -> None:
        consumer, acking = self.app.consumer, self.app.topics.acks_enabled_for
        stalls = {tp: st for tp in list(consumer.assignment()) if acking(tp.topic)  # streams' inputs, no changelog
                  if (st := stall(consumer._acked.get(tp), consumer._committed_offset.get(tp),
                                  consumer._read_offset.get(tp), _end(consumer, tp))) is not None}
        for tp, st in stalls.items():
            if self.seen.get(tp) != st:
                continue  # new, or moving: give the records a check's time to be acknowledged on their own
            since, before = st
            log.warning("%s[%d]: offsets %d..%d were never acknowledged and its commits stopped at %d; reading it "
                        "again from there (faust 0.15.3 after a rebalance)", tp.topic, tp.partition, since,
                        before - 1, since)
            await consumer.seek(tp, since)
            self.mended += 1
        self.seen = {tp: st for tp, st in stalls.items() if self.seen.get(tp) != st}


def watch_offset_gaps(app: faust.App, every_s: float = 15.0) -> GapWatch:
    watch = GapWatch(app)
    app.timer(every_s)(watch.check)
    return watch
