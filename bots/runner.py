"""The Kafka side of a remediation bot: read drain events, act on each once, answer each once (docs/remediation.md).

The ledger is the bot's queue: an event is written to it before its offset is committed, so a request the bot has
acknowledged to Kafka is never lost, and actions that take hours (a drain waiting for jobs, a reboot) run as tasks
that resume from their recorded steps after a restart. Events for one host run one after another, in arrival order;
hosts run side by side. What the bot does on a host is its executor's business (bots/slurm/executor.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from bots.ledger import Entry, Ledger
from core.errors import BrokerError, DecodeError
from core.metrics import Latency
from core.kafka_admin import why_unreachable
from core.settings import CommonSettings
from schemas.analytics import RemediationResult
from schemas.codec import encode
from schemas.topics import DRAIN, REMEDIATION

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str
    measurements: dict[str, float] = field(default_factory=dict)


class Steps:
    """What an executor has done for one event, kept in the ledger: `done(name)` answers whether (and with what) a
    step happened before a restart; `record(name, ...)` writes one the moment it happened."""

    def __init__(self, ledger: Ledger, entry: Entry):
        self._ledger, self._entry = ledger, entry

    def done(self, name: str) -> dict | None:
        return self._entry.steps.get(name)

    def record(self, name: str, **detail) -> None:
        self._ledger.step(self._entry.event["event_id"], name, **detail)


class Executor(Protocol):
    async def cluster_id(self) -> str:
        """The scheduler's own name for its cluster: the default consumer group is one per cluster."""

    async def serves(self, host: str) -> bool:
        """Whether this host is one of the bot's (another cluster's bot answers the rest)."""

    async def act(self, event: dict, steps: Steps) -> Outcome:
        """Carry out one request; an exception is answered as a failure with its text."""


@dataclass
class Counts:
    received: int = 0
    acted: int = 0
    duplicates: int = 0
    not_ours: int = 0
    stale: int = 0
    malformed: int = 0
    answered: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)  # answers with ok false, by action
    action_seconds: dict[str, Latency] = field(default_factory=dict)  # time acting, by action
    last_event_ts: float | None = None  # the newest request taken: its event time
    lag_s: float = 0.0  # when the newest request was taken minus its event time


class BotRunner:
    def __init__(self, settings: CommonSettings, executor: Executor, ledger: Ledger, group_id: str, *,
                 max_age_s: dict[str, float] | None = None, max_concurrent: int = 16,
                 clock: Callable[[], float] = time.time):
        self.settings, self.executor, self.ledger, self.group_id = settings, executor, ledger, group_id
        self.max_age_s = max_age_s or {}
        self.clock = clock
        self._slots = asyncio.Semaphore(max_concurrent)
        self.counts = Counts()
        self._queues: dict[str, asyncio.Queue[Entry]] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._producer: AIOKafkaProducer | None = None
        self._failed: BaseException | None = None

    async def run(self, stop: asyncio.Event, ready: Callable[[], Awaitable[None]] | None = None) -> Counts:
        client = self.settings.kafka_client_args()
        self._producer = AIOKafkaProducer(**client, acks="all", enable_idempotence=True)
        consumer = AIOKafkaConsumer(DRAIN.full(self.settings.topic_prefix), **client, group_id=self.group_id,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            await self._producer.start()
            await consumer.start()
        except KafkaConnectionError as exc:
            await consumer.stop()
            await self._producer.stop()
            raise BrokerError(f"Kafka refuses the bot: {await why_unreachable(client)}") from exc
        try:
            for entry in self.ledger.unsettled():  # a restart: finish what was accepted, send what was not acked
                self._enqueue(entry)
            if ready is not None:
                await ready()
            while not stop.is_set():
                if self._failed is not None:
                    raise self._failed
                batches = await consumer.getmany(timeout_ms=500, max_records=500)
                for tp, records in batches.items():
                    for record in records:
                        await self._take(record, stop)
                    # Every event of the batch is in the ledger (fsynced) or was not ours: safe to commit.
                    await consumer.commit({TopicPartition(tp.topic, tp.partition): records[-1].offset + 1})
        finally:
            for task in self._workers.values():
                task.cancel()
            await asyncio.gather(*self._workers.values(), return_exceptions=True)
            await consumer.stop()
            await self._producer.stop()
        return self.counts

    async def _take(self, record, stop: asyncio.Event) -> None:
        self.counts.received += 1
        try:
            event = DRAIN.decode_keyed(record.key, record.value)
        except DecodeError as exc:  # the sink dead-letters it (one dead letter per record, not one per reader)
            self.counts.malformed += 1
            log.warning("drain event at %s/%d@%d refused: %s", record.topic, record.partition, record.offset, exc)
            return
        if float(event["ts"]) >= (self.counts.last_event_ts or 0.0):
            self.counts.last_event_ts = float(event["ts"])
            self.counts.lag_s = max(0.0, self.clock() - float(event["ts"]))
        if self.ledger.get(event["event_id"]) is not None:  # delivered again (a replay, a resend by the producer):
            self.counts.duplicates += 1  # acted on once; its answer is on the results topic or will be, once
            return
        age = self.clock() - float(event["ts"])
        if age > self.max_age_s.get(event["action"], float("inf")):
            self.counts.stale += 1  # the lifecycle re-sent it long ago (a new group reading from the start)
            log.info("skipped %s %s on %s: %.0f s old", event["action"], event["event_id"], event["host"], age)
            return
        if not await self._serves(event["host"], stop):
            self.counts.not_ours += 1
            return
        self._enqueue(self.ledger.accept(event))

    async def _serves(self, host: str, stop: asyncio.Event) -> bool:
        """Whether the host is this bot's, asked until the scheduler answers: the offset waits meanwhile."""
        delay = 1.0
        while True:
            try:
                return await self.executor.serves(host)
            except Exception as exc:  # noqa: BLE001 - the scheduler is down or restarting: wait, say so
                if stop.is_set():
                    raise
                log.warning("cannot tell whether %r is ours (%s); asking again in %.0f s", host, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _enqueue(self, entry: Entry) -> None:
        host = entry.event["host"]
        if host not in self._queues:
            self._queues[host] = asyncio.Queue()
            self._workers[host] = asyncio.create_task(self._host_worker(host), name=f"bot-{host}")
        self._queues[host].put_nowait(entry)

    async def _host_worker(self, host: str) -> None:
        """A host's requests, one after another; it ends once none is left (checked and ended without a wait in
        between, so _enqueue starts a new one for the next), so a bot over a large fleet holds a task only per host
        with requests in hand."""
        queue = self._queues[host]
        while not queue.empty():
            try:
                await self._settle(queue.get_nowait())
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - the ledger or the broker failed: stop the bot, say why
                self._failed = exc
                return
        del self._queues[host], self._workers[host]

    async def _settle(self, entry: Entry) -> None:
        event = entry.event
        if entry.result is None:
            self.counts.acted += 1
            began = time.monotonic()
            try:
                async with self._slots:
                    outcome = await self.executor.act(event, Steps(self.ledger, entry))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed action is an answer, not a crash
                log.exception("%s %s on %s failed", event["action"], event["event_id"], event["host"])
                outcome = Outcome(False, f"{type(exc).__name__}: {exc}")
            action, c = event["action"], self.counts
            c.action_seconds.setdefault(action, Latency()).observe(time.monotonic() - began)
            if not outcome.ok:
                c.failed[action] = c.failed.get(action, 0) + 1
            result = RemediationResult(event_id=event["event_id"], host=event["host"], action=event["action"],
                                       ok=outcome.ok, ts=self.clock(), detail=outcome.detail[:2000],
                                       measurements=outcome.measurements)
            self.ledger.answer(event["event_id"], result.model_dump(mode="json"))
        await self._send(entry)
        if not entry.sent:
            self.ledger.mark_sent(event["event_id"])
            self.ledger.maybe_compact()

    async def _send(self, entry: Entry) -> None:
        result = entry.result
        topic = REMEDIATION.full(self.settings.topic_prefix)
        await self._producer.send_and_wait(topic, encode(result), key=result["host"].encode())
        self.counts.answered[result["action"]] = self.counts.answered.get(result["action"], 0) + 1
        log.info("answered %s %s on %s: ok=%s %s", result["action"], result["event_id"], result["host"], result["ok"],
                 result["detail"][:200])
