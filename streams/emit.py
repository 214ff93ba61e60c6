"""How stages produce: raw bytes to a named topic through the producer (streams/faust_adapter/producer.py), or into
memory for tests and dry runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from schemas.dead_letter import dead_letter

Headers = list[tuple[str, bytes]]


class Emitter(Protocol):
    async def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None, *,
                   partition: int | None = None) -> Awaitable:
        """Hand one record to the producer (to `partition`, else by key); the returned awaitable completes when the
        broker acknowledged it."""


@dataclass(frozen=True)
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    partition: int | None = None  # None: the producer's, by key


class MemoryEmitter:
    """A first-class fake: records every record a stage produced, acknowledged at once."""

    def __init__(self):
        self.sent: list[Sent] = []

    async def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None, *,
                   partition: int | None = None) -> Awaitable:
        self.sent.append(Sent(topic, key, value, headers, partition))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def to(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]


async def send_dead_letter(emitter: Emitter, dlq_topic: str, msg, reason: str, component: str) -> Awaitable:
    """Route one refused record (a fetched message: its topic, partition, offset, key and value) to its dead-letter
    topic with the reason, source topic, partition and offset."""
    key, value, headers = dead_letter(msg.value, key=msg.key, reason=reason, topic=msg.topic,
                                      partition=msg.partition, offset=msg.offset, component=component)
    return await emitter.send(dlq_topic, key, value, headers)
