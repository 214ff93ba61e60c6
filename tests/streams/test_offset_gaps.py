"""The offset-gap watchdog's decision: a stall that stays put over two checks is read again from the committed
offset; one that moves, a single missing record (faust commits past it) or a fully committed partition is left
alone. The stalls themselves come from faust around a rebalance: `fleetpulse evaluate --scenario llama3-mix
--kill-worker-at 900` and tests/streams/test_lifecycle_integration.py are where they show (docs/evaluation.md)."""

from __future__ import annotations

from types import SimpleNamespace

from faust.types import TP

from streams.runtime.offsets import GapWatch, stall

SAMPLES = TP("fleet.telemetry.samples", 3)
OTHER = TP("fleet.telemetry.samples", 4)
CHANGELOG = TP("fleetpulse-streams-health-hosts-changelog", 3)  # read by table recovery, never acknowledged


class Consumer:
    """faust's consumer as GapWatch reads it: assignment, acknowledged offsets, committed offsets, seek."""

    def __init__(self):
        self._acked = {SAMPLES: [7600, 7601, 7602], OTHER: [10, 11]}
        self._committed_offset = {SAMPLES: 7522, OTHER: 10}
        self._read_offset = {SAMPLES: 7602, OTHER: 11, CHANGELOG: 40}
        self.ends = {SAMPLES: 7700, OTHER: 12, CHANGELOG: 41}
        self.seeks: list[tuple[TP, int]] = []

    def assignment(self):
        return {SAMPLES, OTHER, CHANGELOG}

    def highwater(self, tp: TP) -> int:
        return self.ends[tp]

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_what_counts_as_stuck():
    assert stall([7600, 7601], 7522, 7601, 7700) == (7522, 7600)  # head gap: 7522..7599 never acknowledged
    assert stall([7523, 7524], 7522, 7524, 7600) is None  # one record missing: faust commits past it
    assert stall([7522], 7522, 7522, 7600) is None and stall([5], None, 5, 9) is None  # acknowledged, commit due
    assert stall([], 2, 1, 2) is None and stall([], 2, 2, 2) is None  # all committed (or just sought), nothing past
    assert stall([], None, None, 4) == (0, 4)  # never handed out (stuck only if it stays so for two checks)
    assert stall([], None, None, None) is None and stall([], 3, None, 3) is None  # nothing there to read
    assert stall([], None, 1, 2) == (0, 2) and stall([], 5, 7, 8) == (5, 8)  # handed out, never acknowledged


async def test_a_gap_that_stays_is_read_again_once_and_a_moving_one_is_left_alone():
    consumer = Consumer()
    acking = SimpleNamespace(acks_enabled_for=lambda topic: not topic.endswith("-changelog"))
    watch = GapWatch(SimpleNamespace(consumer=consumer, topics=acking))
    await watch.check()
    assert consumer.seeks == []  # first sighting: the records may still arrive
    consumer._acked[SAMPLES].append(7603)
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)] and watch.mended == 1  # same head gap: read again from 7522
    # (the changelog partition looks stuck the same way, but only table recovery reads it: never sought)
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]  # seen again only after another full check
    consumer._committed_offset[SAMPLES] = 7530  # it moved: not stuck
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]
