"""A lane's inbox: batches of at most max_n, a lone record after `within_s`, and room waited for when full."""

from __future__ import annotations

import asyncio
import time

from streams.runtime.inbox import Inbox


def test_a_backlog_comes_out_in_order_in_batches_of_at_most_max_n_without_waiting():
    async def main():
        box = Inbox(100)
        for i in range(25):
            box.put(i)
        started = time.monotonic()
        batches = [await box.take(10, within_s=5.0) for _ in range(2)]
        return batches, time.monotonic() - started, len(box)

    batches, waited, left = asyncio.run(main())
    assert batches == [list(range(10)), list(range(10, 20))] and left == 5
    assert waited < 1.0  # full batches never wait for within_s


def test_a_lone_record_waits_at_most_within_s_and_a_filling_batch_goes_as_soon_as_it_is_full():
    async def main():
        box = Inbox(100)
        taker = asyncio.ensure_future(box.take(3, within_s=0.2))
        await asyncio.sleep(0.05)
        assert not taker.done()  # nothing yet: it waits for a first record however long
        box.put("a")
        started = time.monotonic()
        lone = await taker
        lone_s = time.monotonic() - started
        taker = asyncio.ensure_future(box.take(3, within_s=30.0))
        for r in "bcd":
            box.put(r)
            await asyncio.sleep(0)
        full = await asyncio.wait_for(taker, 5)
        return lone, lone_s, full, list(box.items)

    lone, lone_s, full, left = asyncio.run(main())
    assert lone == ["a"] and 0.1 < lone_s < 2.0
    assert full == ["b", "c", "d"] and left == []


def test_a_full_inbox_holds_the_fetch_loop_until_the_lane_takes_a_batch():
    async def main():
        box = Inbox(4)
        for i in range(4):
            box.put(i)
        assert box.full()
        waiting = asyncio.ensure_future(box.room())
        await asyncio.sleep(0.05)
        held = not waiting.done()
        assert await box.take(2, within_s=0.1) == [0, 1]
        await asyncio.wait_for(waiting, 5)
        return held

    assert asyncio.run(main())


class Rec:
    def __init__(self, topic: str, n: int):
        self.topic, self.n = topic, n

    def __repr__(self) -> str:
        return f"{self.topic}#{self.n}"


def test_an_event_goes_ahead_of_the_samples_already_waiting_and_each_topic_keeps_its_order():
    async def main():
        box = Inbox(100, frozenset({"xid"}))
        for i in range(60):
            box.put(Rec("samples", i))
        box.put(Rec("xid", 0))
        box.put(Rec("samples", 60))
        box.put(Rec("xid", 1))
        return [await box.take(50, within_s=1.0) for _ in range(2)]

    first, second = asyncio.run(main())
    assert [repr(r) for r in first[:2]] == ["xid#0", "xid#1"]
    assert [r.n for r in first[2:]] == list(range(48)) and [r.n for r in second] == list(range(48, 61))


def test_an_event_does_not_wait_for_a_batch_to_fill_nor_for_room_behind_a_full_inbox_of_samples():
    async def main():
        box = Inbox(4, frozenset({"xid"}))
        taker = asyncio.ensure_future(box.take(500, within_s=30.0))
        box.put(Rec("samples", 0))
        await asyncio.sleep(0.05)
        assert not taker.done()  # a lone sample waits for the batch to fill
        box.put(Rec("xid", 0))
        batch = await asyncio.wait_for(taker, 5)
        for i in range(1, 5):
            box.put(Rec("samples", i))
        assert box.full() and box.full(Rec("samples", 5)) and not box.full(Rec("xid", 1))
        await asyncio.wait_for(box.room(Rec("xid", 1)), 1)  # room for an event at once
        return batch

    assert [repr(r) for r in asyncio.run(main())] == ["xid#0", "samples#0"]


def test_a_lane_puts_event_topics_and_those_derived_from_them_ahead_of_periodic_ones():
    from schemas.topics import DRAIN, HOST_EVENTS, NCCL, SAMPLES, TOPICS, XID
    from streams import registry
    from streams.runtime.lane import Lane, Wired

    assert {t.name for t in TOPICS.values() if t.periodic} == {
        "fleet.telemetry.samples", "fleet.telemetry.nccl", "fleet.telemetry.agent", "fleet.telemetry.net",
        "fleet.health.scores", "fleet.stragglers", "fleet.usable_compute"}
    (fault_bins,) = registry.select(["fault_bins"])
    steps = [Wired(fault_bins, step, None, {}, None, None) for step in fault_bins.steps]
    lane = Lane("t", steps, prefix="p.", app_id="p.app", emitter=None, metrics=None, batch_max=500, within_s=0.1)
    assert set(lane.urgent) == {XID.full("p."), HOST_EVENTS.full("p.")} and SAMPLES.full("p.") in lane.sources
    assert NCCL.full("p.") not in lane.urgent and DRAIN.periodic is False
