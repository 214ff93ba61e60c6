"""The agents' Kafka publisher: idempotent, zstd-compressed, keyed per topic, deliveries checked in bulk."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import aiokafka.errors as kafka_errors
from aiokafka import AIOKafkaProducer
from aiokafka.codec import has_zstd
from aiokafka.errors import KafkaError
from pydantic import BaseModel

from core.errors import BrokerError, ConfigError
from core.settings import CommonSettings
from schemas.codec import encode
from schemas.topics import Topic

DEFAULT_MAX_PENDING = 20_000
# The broker refuses the record itself: sending it again can never succeed, so it is counted in `failed`, not kept.
REFUSED = (kafka_errors.MessageSizeTooLargeError, kafka_errors.RecordListTooLargeError,
           kafka_errors.RecordTooLargeError, kafka_errors.CorruptRecordException, kafka_errors.InvalidTopicError,
           kafka_errors.InvalidTimestampError, kafka_errors.UnsupportedForMessageFormatError)


class Publisher:
    """Sends registry messages to `settings.topic_prefix + topic.name`, keyed by `topic.key_of(value)`.

    `send` only enqueues; delivery results are collected and checked by `flush` (called automatically once
    `max_pending` deliveries are outstanding), so a burst of thousands of records is batched by the producer
    instead of awaited one at a time. `sent` counts delivered records per registry topic name.
    Subclasses extend delivery by overriding `_produce` (agents.spool.SpoolingPublisher adds an on-disk spool).
    """

    def __init__(self, settings: CommonSettings, *, client_id: str = "fleetpulse-agent", linger_ms: int = 20,
                 compression_type: str | None = "zstd", max_batch_size: int = 512 * 1024,
                 max_pending: int = DEFAULT_MAX_PENDING, **producer_args):
        if compression_type == "zstd" and not has_zstd():
            raise ConfigError("zstd compression needs cramjam (pip install 'aiokafka[zstd]')")
        self.settings = settings
        self.prefix = settings.topic_prefix
        self.max_pending = max_pending
        self.sent: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._producer_args = {
            **settings.kafka_client_args(), "client_id": client_id, "enable_idempotence": True, "acks": "all",
            "compression_type": compression_type, "linger_ms": linger_ms, "max_batch_size": max_batch_size,
            **producer_args,
        }
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(**self._producer_args)
        try:
            await producer.start()
        except KafkaError as exc:
            await producer.stop()
            raise BrokerError(f"cannot connect the producer to {self.settings.bootstrap}: {exc!r}") from exc
        self._producer = producer

    async def send(self, topic: Topic, value: dict | BaseModel) -> None:
        """Encode and enqueue one record; returns once the producer accepted it (not once it is delivered)."""
        data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        await self._produce(topic, topic.key_of(data), encode(data))

    async def send_many(self, topic: Topic, values: list[dict]) -> None:
        for value in values:
            await self._produce(topic, topic.key_of(value), encode(value))

    async def _produce(self, topic: Topic, key: bytes, value: bytes) -> None:
        if self._producer is None:
            raise RuntimeError("Publisher.start() was not called")
        try:
            future = await self._producer.send(topic.full(self.prefix), value=value, key=key)
        except KafkaError as exc:  # refused before it was queued (too large, unknown topic, producer closed)
            self.failed[topic.name] += 1
            error = BrokerError(f"{topic.full(self.prefix)}: record refused by the producer: {exc!r}")
            error.retryable = bool(getattr(exc, "retriable", False))
            raise error from exc
        self._pending.append((topic.name, future))
        if len(self._pending) >= self.max_pending:
            await self.flush()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Wait for every outstanding delivery; count them; raise BrokerError if any failed."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        first_error: BaseException | None = None
        for (name, _), result in zip(pending, results):
            if isinstance(result, BaseException):
                self.failed[name] += 1
                first_error = first_error or result
            else:
                self.sent[name] += 1
        if first_error is not None:
            error = BrokerError(f"{sum(self.failed.values())} records not delivered; first: {first_error!r}")
            error.retryable = getattr(first_error, "retriable", True)
            raise error from first_error

    async def close(self) -> None:
        """Flush what is outstanding, then stop the producer (also when the flush failed)."""
        if self._producer is None:
            return
        try:
            await self.flush()
        finally:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def failed_future(exc: BaseException) -> asyncio.Future:
    """A delivery future that already failed (a record refused before the producer queued it)."""
    future = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future


async def retire(producer: AIOKafkaProducer, grace_s: float = 2.0) -> None:
    """Stop a producer; if it cannot flush within `grace_s` (broker away), tear it down without delivering.

    aiokafka has no abort for an idempotent producer: stop() waits for every queued batch forever. The teardown
    cancels its sender, fails what is still queued (those records are already back in the spool) and closes
    the client. This reaches into aiokafka internals (`_sender`, `_message_accumulator`), pinned to aiokafka 0.14.
    """
    stop = asyncio.create_task(producer.stop())
    done, _ = await asyncio.wait({stop}, timeout=grace_s)
    if done:
        with contextlib.suppress(KafkaError, OSError):
            stop.result()
        return
    stop.cancel()
    with contextlib.suppress(asyncio.CancelledError, KafkaError, OSError):
        await stop
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer._sender.close(), grace_s)
    producer._message_accumulator.fail_all(kafka_errors.KafkaConnectionError("producer retired during an outage"))
    with contextlib.suppress(Exception):
        await producer.client.close()
