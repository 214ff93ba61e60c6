"""A lane's inbox: fetched records handed straight from the fetch loop to the lane, in batches, without faust's
per-record path (an Event, a channel queue, a stream iterator and a take buffer for every record).

faust keeps what it serves: group membership, assignment, offsets and their commits, tables and their changelogs.
The fetch loop (streams/faust_adapter/delivery.py) puts a record of a lane's input topic here instead of through the
conductor; the lane takes a batch, tracks its records as faust's streams do (so a rebalance waits for them), runs
it, and acknowledges each record to faust's consumer, which commits what is acknowledged. After a rebalance the lane
drops the records fetched under the group's previous generation (faust seeks its partitions to their committed
offsets and fetches them again, if they are still this worker's). An inbox is not emptied by faust's flow control:
faust's resume() empties its stream queues after the seek, which lost records fetched in between (seen in
tests/streams/test_worker_integration.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Inbox:
    """Records for one lane, oldest first; at most `maxsize` before the fetch loop waits for room."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.items: deque = deque()
        self._want = 0  # the taker wakes when this many records are here
        self._waiter: asyncio.Future | None = None
        self._room: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self.items)

    def full(self) -> bool:
        return len(self.items) >= self.maxsize

    def put(self, record: Any) -> None:
        """Add a record (the fetch loop checks full() and waits for room() first)."""
        self.items.append(record)
        if self._waiter is not None and len(self.items) >= self._want and not self._waiter.done():
            self._waiter.set_result(None)

    async def room(self) -> None:
        """Until the inbox is below its size."""
        while self.full():
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()

    async def take(self, max_n: int, within_s: float) -> list:
        """The next batch: waits for a first record, then up to `within_s` for `max_n` of them; at most `max_n`."""
        if not self.items:
            await self._until(1, None)
        if len(self.items) < max_n:
            await self._until(max_n, within_s)
        n = min(max_n, len(self.items))
        batch = [self.items.popleft() for _ in range(n)]
        self._made_room()
        return batch

    async def _until(self, want: int, timeout_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._want = want
        timer = loop.call_later(timeout_s, _wake, waiter) if timeout_s is not None else None
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    def _made_room(self) -> None:
        if self._room is not None and not self.full():
            self._room.set()


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
