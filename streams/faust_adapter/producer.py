"""The producer: faust's, with idempotence on, and the stages' emitter over it."""

from __future__ import annotations

from collections.abc import Awaitable

import faust
from faust.transport.drivers import aiokafka as faust_kafka

from streams.emit import Headers


class IdempotentProducer(faust_kafka.Producer):
    """faust's producer with idempotence on: faust 0.15 turns it on only inside transactions, so a send retried after
    a broker died between writing a stage's output and answering could write it twice. acks stays all (faust's -1)."""

    def _settings_extra(self) -> dict:
        return {**super()._settings_extra(), "enable_idempotence": True}


class TopicEmitter:
    """The production emitter: the app's producer, given the stages' bytes as they are (no faust topic, serializer or
    sensor on the way); the producer partitions by key, as faust's own sends do, unless the record names its
    partition (a table's changelog record goes to the partition of the source record that set it)."""

    def __init__(self, app: faust.App):
        self.app = app

    async def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None, *,
                   partition: int | None = None) -> Awaitable:
        producer = await self.app.maybe_start_producer()
        return await producer.send(topic, key, value, partition, None, headers)
