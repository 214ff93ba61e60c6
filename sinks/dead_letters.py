"""The sink's dead letters: a refused record goes to its topic's `.dlq` once, with the reason (schemas/dead_letter.py),
through the same waiting as every other write of the sink (sinks/outage.py)."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer

from core.logs import LogBudget
from schemas.dead_letter import dead_letter
from schemas.topics import Topic
from sinks.outage import Outages

log = logging.getLogger("fleetpulse.sink")


class DeadLetters:
    def __init__(self, producer: AIOKafkaProducer, outages: Outages, prefix: str):
        self.producer, self.outages, self.prefix = producer, outages, prefix
        self.budget = LogBudget()  # a flood of bad records is counted in full, logged 20 lines a minute

    async def send(self, base: Topic, topic: str, partition: int, offset: int, value: bytes | None,
                   key: bytes | None, reason: str) -> None:
        key, envelope, headers = dead_letter(value, key=key, reason=reason, topic=topic, partition=partition,
                                             offset=offset, component="sink")
        await self.outages.call(f"dead letter of {topic}[{partition}]@{offset}", lambda: self.producer.send_and_wait(
            base.dlq(self.prefix), envelope, key=key, headers=headers))
        self.log(f"dead-lettered {topic}[{partition}]@{offset}: {reason}")

    def log(self, line: str) -> None:
        show, held = self.budget.take()
        if show:
            log.warning("%s%s", line, self.budget.suffix(held))
