"""The offset-gap watchdog's decision: a head gap that stays put over two checks is read again from the committed
offset; one that moves, a single missing record (faust commits past it) or a partition without acks is left alone.
The stall itself needs a double rebalance at scale; `fleetpulse evaluate --scenario llama3-mix --kill-worker-at 900`
is where it shows (docs/evaluation.md)."""

from __future__ import annotations

from types import SimpleNamespace

from faust.types import TP

from streams.runtime.offsets import GapWatch, head_gap

SAMPLES = TP("fleet.telemetry.samples", 3)
OTHER = TP("fleet.telemetry.samples", 4)


class Consumer:
    """faust's consumer as GapWatch reads it: assignment, acknowledged offsets, committed offsets, seek."""

    def __init__(self):
        self._acked = {SAMPLES: [7600, 7601, 7602], OTHER: [10, 11]}
        self._committed_offset = {SAMPLES: 7522, OTHER: 10}
        self.seeks: list[tuple[TP, int]] = []

    def assignment(self):
        return {SAMPLES, OTHER}

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_head_gap():
    assert head_gap([7600, 7601], 7522) == (7522, 7600)
    assert head_gap([7523, 7524], 7522) is None  # one record missing: faust commits past it
    assert head_gap([7522], 7522) is None and head_gap([], 7522) is None and head_gap([5], None) is None


async def test_a_gap_that_stays_is_read_again_once_and_a_moving_one_is_left_alone():
    consumer = Consumer()
    watch = GapWatch(SimpleNamespace(consumer=consumer))
    await watch.check()
    assert consumer.seeks == []  # first sighting: the records may still arrive
    consumer._acked[SAMPLES].append(7603)
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)] and watch.mended == 1  # same head gap: read again from 7522
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]  # seen again only after another full check
    consumer._committed_offset[SAMPLES] = 7530  # it moved: not stuck
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]
