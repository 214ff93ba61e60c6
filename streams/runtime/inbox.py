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

A lane's event topics (kernel-log lines, faults, drain and remediation records: `Topic.periodic` false) go ahead of
its periodic ones (every host's samples and NCCL steps each interval): a worker behind on telemetry takes an XID line
in its next batch instead of after the thousands of samples already in its inbox (XID -> drain p99 4.9 s at 5,000
hosts, bench/fleet_scale.py). Each partition's records keep their order, since a partition holds one topic's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Inbox:
    """Records for one lane, oldest first but those of the `urgent` topics ahead of the rest; at most `maxsize` of
    either kind before the fetch loop waits for room for one of that kind."""

    def __init__(self, maxsize: int, urgent: frozenset[str] = frozenset()):
        self.maxsize, self.urgent = maxsize, urgent
        self.items: deque = deque()  # the periodic records
        self.ahead: deque = deque()  # the urgent topics' records
        self._want = 0  # the taker wakes when this many records are here
        self._waiter: asyncio.Future | None = None
        self._room: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self.items) + len(self.ahead)

    def full(self, record: Any = None) -> bool:
        """No room for `record` (one of the periodic topics' if None)."""
        return len(self._queue(record)) >= self.maxsize

    def _queue(self, record: Any) -> deque:
        return self.ahead if getattr(record, "topic", None) in self.urgent else self.items

    def put(self, record: Any) -> None:
        """Add a record (the fetch loop checks full(record) and waits for room(record) first); an urgent one wakes a
        lane waiting to fill its batch."""
        queue = self._queue(record)
        queue.append(record)
        if self._waiter is not None and not self._waiter.done() and (queue is self.ahead or len(self) >= self._want):
            self._waiter.set_result(None)

    async def room(self, record: Any = None) -> None:
        """Until there is room for `record` (one of the periodic topics' if None)."""
        while self.full(record):
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()

    async def take(self, max_n: int, within_s: float) -> list:
        """The next batch, urgent records first: waits for a first record, then up to `within_s` for `max_n` of them
        unless an urgent one is here; at most `max_n`."""
        if not len(self):
            await self._until(1, None)
        if len(self) < max_n and not self.ahead:
            await self._until(max_n, within_s)
        batch = [self.ahead.popleft() for _ in range(min(max_n, len(self.ahead)))]
        batch += [self.items.popleft() for _ in range(min(max_n - len(batch), len(self.items)))]
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
        if self._room is not None and (len(self.items) < self.maxsize or len(self.ahead) < self.maxsize):
            self._room.set()


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
