"""The spooling publisher's pump: counts acknowledgements, notices a stalled broker, replays the spool in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError

from agents.publisher import REFUSED, failed_future
from agents.spool.record import Spooled, SpoolRecord
from agents.spool.store import Spool, SpoolUnwritable
from core.settings import CommonSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InflightRecord:
    """A record handed straight to the producer, and when."""

    record: SpoolRecord
    future: asyncio.Future
    sent_at: float


class SpoolReplay:
    """Mixin of SpoolingPublisher: the background pump and the bookkeeping of what the broker acknowledged."""

    spool: Spool
    sent: Counter[str]
    failed: Counter[str]
    replayed: int
    spooled: int
    pump_errors: int
    replay_batch: int
    stall_after_s: float
    _inflight: deque[InflightRecord]
    _direct: bool
    _broken: bool
    _sending: int
    _handover: asyncio.Event | None
    _replaying: list[tuple[Spooled, asyncio.Future]]
    _wake: asyncio.Event
    _producer: AIOKafkaProducer | None
    prefix: str
    settings: CommonSettings

    async def _connect(self) -> bool:
        raise NotImplementedError

    async def _send(self, record: SpoolRecord) -> asyncio.Future:
        raise NotImplementedError

    def _outage(self, reason: str, *, broken: bool = False) -> None:
        raise NotImplementedError

    def _unspoolable(self, records: int, exc: SpoolUnwritable) -> None:
        raise NotImplementedError

    async def _pump(self) -> None:
        """Supervised: an unexpected error in one round (an unreadable spool, a client bug) is logged and counted,
        and the pump goes on after a pause, so the spool never stops draining for good."""
        backoff = 0.2
        while True:
            try:
                backoff = await self._pump_round(backoff)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the pump must outlive anything one round can hit
                self.pump_errors += 1
                log.exception("spool pump failed (%d so far); going on in %.1fs", self.pump_errors, backoff)
                await self._idle(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _pump_round(self, backoff: float) -> float:
        """One round of the pump; returns the next backoff."""
        self.spool.sync_due()
        if self._direct:
            self._reap()
            if self._inflight and time.monotonic() - self._inflight[0].sent_at > self.stall_after_s:
                self._outage(f"no acknowledgement for {self.stall_after_s:g}s")
            await self._idle(0.25)
            return backoff
        await self._settle()
        if (self._producer is None or self._broken) and not await self._connect():
            await self._idle(backoff)
            return min(backoff * 2, 5.0)
        batch = self.spool.peek(self.replay_batch)
        if not batch:
            self._back_to_direct()
            return backoff
        # The batch that empties the spool holds new records back until it is acknowledged (at most
        # stall_after_s), so the spool drains for good even while records keep arriving.
        last = len(batch) == len(self.spool)
        self._handover = asyncio.Event() if last else None
        try:
            delivered = await self._replay(batch)
            if delivered and last and len(self.spool) == 0:
                self._back_to_direct()
        finally:
            if self._handover is not None:
                self._handover.set()
                self._handover = None
        if delivered:
            return 0.2
        await self._idle(backoff)
        return min(backoff * 2, 5.0)

    def _back_to_direct(self) -> None:
        self._direct = True
        log.info("broker %s acknowledging: spool drained (%d replayed so far)", self.settings.bootstrap, self.replayed)

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    def _account(self, entry: InflightRecord) -> bool:
        """Count a finished direct delivery (sent, or refused for good); False if the record must be sent again."""
        if not entry.future.done():
            return False
        name = self._name(entry.record.topic)
        exc = entry.future.exception()
        if exc is None:
            self.sent[name] += 1
        elif isinstance(exc, REFUSED):
            self.failed[name] += 1
            log.error("%s: record refused by the broker: %r", entry.record.topic, exc)
        else:
            return False
        return True

    def _reap(self) -> None:
        """Count acknowledged records at the head; a failed one ends direct mode (it goes back to the spool)."""
        while self._inflight and self._inflight[0].future.done():
            if not self._account(self._inflight[0]):
                self._outage(f"delivery failed: {self._inflight[0].future.exception()!r}", broken=True)
                return
            self._inflight.popleft()

    async def _settle(self) -> None:
        """Wait for every direct record still in the producer; failed ones go back to the head of the spool."""
        while self._sending or not all(e.future.done() for e in self._inflight):
            await self._idle(0.25)
        failed = [e.record for e in self._inflight if not self._account(e)]
        self._inflight.clear()
        if failed:
            self._broken = True
            try:
                self.spool.prepend(failed)
                self.spooled += len(failed)
            except SpoolUnwritable as exc:
                self._unspoolable(len(failed), exc)

    async def _replay(self, batch: list[Spooled]) -> bool:
        """Send one batch from the spool head; commit the acknowledged prefix. True if all of it went."""
        sent = self._replaying = []  # kept on the instance: a shutdown mid-batch still commits what was acked
        for item in batch:
            try:
                sent.append((item, await self._send(item.record)))
            except REFUSED as exc:
                sent.append((item, failed_future(exc)))
            except (KafkaError, TimeoutError) as exc:
                self._broken = self._broken or not isinstance(exc, (KafkaTimeoutError, TimeoutError))
                break
        if sent:
            await asyncio.wait([f for _, f in sent])  # the producer retries on its own until the broker answers
        return self._commit_replayed() is batch[-1]

    def _commit_replayed(self) -> Spooled | None:
        """Count the replay batch's finished deliveries in order; commit up to the first that is not (returned)."""
        sent, self._replaying = self._replaying, []
        done: Spooled | None = None
        for item, future in sent:
            exc = future.exception() if future.done() else KafkaTimeoutError()
            if exc is not None and not isinstance(exc, REFUSED):
                self._broken = True
                break
            if exc is None:
                self.sent[self._name(item.record.topic)] += 1
                self.replayed += 1
            else:
                self.failed[self._name(item.record.topic)] += 1
                log.error("%s: spooled record refused by the broker: %r", item.record.topic, exc)
            done = item
        if done is not None:
            self.spool.commit(done)
        return done

    def _name(self, full_topic: str) -> str:
        prefix = self.prefix
        return full_topic[len(prefix):] if prefix and full_topic.startswith(prefix) else full_topic
