"""SpoolingPublisher: the Publisher with an on-disk spool, so broker outages and agent restarts lose nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError

from agents.publisher import REFUSED, Publisher, retire
from agents.spool.record import SpoolRecord
from agents.spool.replay import InflightRecord, SpoolReplay
from agents.spool.store import Spool, SpoolUnwritable
from core.errors import BrokerError
from core.kafka_admin import why_unreachable
from core.logs import LogBudget
from core.settings import CommonSettings
from schemas.topics import Topic

log = logging.getLogger(__name__)


class SpoolingPublisher(SpoolReplay, Publisher):
    """Sends directly while the broker acknowledges; spools to disk while it does not; replays in order.

    Direct mode: records go to one long-lived idempotent producer, which retries a dropped connection itself with
    the same producer id and sequence numbers, so a short outage costs no duplicate. When the oldest unacknowledged
    record is older than `stall_after_s`, a send cannot be queued within `send_timeout_s`, or a delivery fails,
    new records go to the spool instead. A background pump waits for the records still in the producer (failed
    ones go back to the head of the spool, in order), then replays the spool oldest first in batches, moving the
    spool's cursor only past acknowledged records; new records queue behind, so the order per key holds. Once the
    spool is empty, direct mode resumes. A failed delivery also replaces the producer (new producer id), as the
    old one's sequence numbers no longer match the broker's.

    What can duplicate: a record the broker wrote but whose acknowledgement never arrived, sent again under a new
    producer id: (a) a delivery that failed instead of being retried (aiokafka expires a batch whose partition has
    no leader for `request_timeout_ms`), (b) the request in flight per partition when a shutdown deadline retires
    the producer (its records are spooled; the next run sends them). Both are at most one batch per partition.
    (c) After a crash (no clean shutdown) the replay batch that was acknowledged but not yet committed (at most
    `replay_batch` records), and after a power loss what the fsync interval had not made durable of the cursor.
    What can be lost: records inside the producer (not yet in
    the spool) when the process is killed without a clean shutdown, at most `stall_after_s` worth during an
    outage; records the spool drops when full (oldest first, counted in `dropped`); what the spool's fsync policy
    leaves unsynced at a power loss; records the broker refuses outright (REFUSED, counted in `failed`).
    """

    def __init__(self, settings: CommonSettings, spool: Spool, *, stall_after_s: float = 5.0,
                 send_timeout_s: float = 2.0, connect_timeout_s: float = 10.0, shutdown_timeout_s: float = 10.0,
                 replay_batch: int = 500, clock: Callable[[], float] = time.time, **kwargs):
        super().__init__(settings, **kwargs)
        self.spool = spool
        self.stall_after_s, self.send_timeout_s = stall_after_s, send_timeout_s
        self.connect_timeout_s, self.shutdown_timeout_s = connect_timeout_s, shutdown_timeout_s
        self.replay_batch, self.clock = replay_batch, clock
        self.spooled = self.replayed = self.outages = self.unspooled = self.pump_errors = 0
        self._unspooled_log = LogBudget(per_minute=1)
        self._inflight: deque[InflightRecord] = deque()
        self._direct = False  # new records go straight to the producer
        self._broken = False  # the producer must be replaced before the next send
        self._sending = 0  # direct sends waiting for the producer to queue them
        self._pump_task: asyncio.Task | None = None
        self._handover: asyncio.Event | None = None
        self._replaying: list = []  # the replay batch inside the producer
        self._wake = asyncio.Event()
        self._started = self._closing = False

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect if the broker answers; otherwise start spooling and keep trying in the background."""
        if self._started:
            return
        self._started = True
        if await self._connect():
            self._direct = len(self.spool) == 0
        else:
            why = await why_unreachable(self._producer_args, timeout=self.connect_timeout_s)
            log.warning("broker %s not usable (%s): spooling to %s, retrying", self.settings.bootstrap, why,
                        self.spool.dir)
        self._pump_task = asyncio.create_task(self._pump(), name="spooling-publisher-pump")

    async def close(self, timeout: float | None = None) -> None:
        """Deliver what can be delivered within `timeout` (default shutdown_timeout_s); spool the rest; stop."""
        if not self._started or self._closing:
            return
        self._closing = True
        await self.flush(self.shutdown_timeout_s if timeout is None else timeout)
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        if self._producer is not None:  # a last chance to deliver; then what it still holds fails
            await retire(self._producer)
            self._producer = None
        self._commit_replayed()
        leftover = [e.record for e in self._inflight if not self._account(e)]
        self._inflight.clear()
        if leftover:  # never acknowledged: the next run sends them (a duplicate if the broker wrote them)
            try:
                self.spool.prepend(leftover)
                self.spooled += len(leftover)
                log.warning("shutdown: %d unacknowledged records put back in the spool", len(leftover))
            except SpoolUnwritable as exc:
                self._unspoolable(len(leftover), exc)
        self.spool.close()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record is acknowledged and the spool is empty; False if `timeout` passed first."""
        if not self._started:
            return self.pending == 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self._direct and not self._inflight and not self._sending and len(self.spool) == 0):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if self._direct and self._inflight:
                await asyncio.wait([e.future for e in self._inflight], timeout=left)
                self._reap()
            else:
                await asyncio.sleep(0.02 if left is None else min(0.02, left))
        return True

    # -- sending ---------------------------------------------------------------------------------------------------
    async def _produce(self, topic: Topic, key: bytes, value: bytes, headers=()) -> None:
        if not self._started or self._closing:
            raise RuntimeError("SpoolingPublisher is not running (start() not called, or closed)")
        record = SpoolRecord(topic.full(self.prefix), key, value, self.clock(), tuple(headers))
        if self._handover is not None:  # the spool's last batch is on its way: wait for it, then go direct
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.stall_after_s):
                    await self._handover.wait()
        if self._direct and self._inflight and self._inflight[0].future.done():
            self._reap()
        if self._direct and len(self._inflight) >= self.max_pending:
            self._outage(f"{len(self._inflight)} records unacknowledged")
        if self._direct and await self._send_direct(record, topic.name):
            return
        try:
            self.spool.append(record)
        except ValueError as exc:
            self.failed[topic.name] += 1
            raise BrokerError(f"{record.topic}: record refused by the spool: {exc}") from exc
        except SpoolUnwritable as exc:  # a full disk: count the record and keep sampling
            self._unspoolable(1, exc)
            return
        self.spooled += 1
        self._wake.set()

    def _unspoolable(self, records: int, exc: SpoolUnwritable) -> None:
        """Records neither the broker nor the disk took: counted in `dropped`, said at once and then once a minute."""
        self.unspooled += records
        if self._unspooled_log.take()[0]:
            log.error("%s; %d records dropped so far (the broker is not acknowledging and the spool cannot grow)",
                      exc, self.unspooled)

    async def _send_direct(self, record: SpoolRecord, name: str) -> bool:
        self._sending += 1
        try:
            future = await self._send(record)
        except REFUSED as exc:
            self.failed[name] += 1
            raise BrokerError(f"{record.topic}: record refused by the producer: {exc!r}") from exc
        except (KafkaError, TimeoutError) as exc:
            self._outage(f"send failed: {exc!r}", broken=not isinstance(exc, (KafkaTimeoutError, TimeoutError)))
            return False
        finally:
            self._sending -= 1
        self._inflight.append(InflightRecord(record, future, time.monotonic()))
        return True

    async def _send(self, record: SpoolRecord) -> asyncio.Future:
        async with asyncio.timeout(self.send_timeout_s):  # metadata wait or a full batch queue: the broker is away
            return await self._producer.send(record.topic, record.value, key=record.key,
                                             timestamp_ms=int(record.ts * 1000), headers=list(record.headers) or None)

    def _outage(self, reason: str, *, broken: bool = False) -> None:
        self._broken = self._broken or broken
        if self._direct:
            self._direct = False
            self.outages += 1
            log.warning("broker %s not acknowledging (%s): spooling to %s", self.settings.bootstrap, reason,
                        self.spool.dir)
        self._wake.set()

    async def _connect(self) -> bool:
        if self._producer is not None:
            await retire(self._producer)
            self._producer = None
        producer = AIOKafkaProducer(**self._producer_args)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await producer.start()
        except (KafkaError, OSError, TimeoutError) as exc:
            log.debug("producer cannot connect to %s: %r", self.settings.bootstrap, exc)
            await retire(producer)
            return False
        except asyncio.CancelledError:
            await retire(producer)
            raise
        self._producer, self._broken = producer, False
        return True

    # -- state -----------------------------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._inflight) + len(self.spool)

    @property
    def connected(self) -> bool:
        """True while records go straight to an acknowledging broker."""
        return self._direct

    @property
    def dropped(self) -> int:
        """Records given up: the oldest when the spool was full, and those the disk refused (unspooled)."""
        return self.spool.dropped + self.unspooled

    @property
    def spool_bytes(self) -> int:
        return self.spool.bytes
