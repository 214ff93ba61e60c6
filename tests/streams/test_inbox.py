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
