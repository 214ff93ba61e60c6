"""The simulated remediation bot of `fleetpulse up`: it answers the lifecycle's drain, repair, validate and undrain
requests on fleet.drain.events with results on fleet.remediation.results, each after the scenario's delay for that
action (scaled by the run's speed), as the evaluation's bot does on simulated time. The simulator follows its repairs
(`simulate --follow-repairs`), so a node is taken out, mended, validated and put back while `up` runs."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.publisher import Publisher
from core.errors import DecodeError
from core.settings import CommonSettings
from fleetpulse.evaluate.bot import SimulatedBotConfig, SimulatedBot
from schemas.codec import decode
from schemas.topics import DRAIN, REMEDIATION

log = logging.getLogger("fleetpulse.up.bot")


async def answer_drains(settings: CommonSettings, config: SimulatedBotConfig, speed: float, stop: asyncio.Event) -> int:
    """Answer every drain event published from now until `stop`; returns how many answers went out."""
    bot = SimulatedBot(config)
    topic = DRAIN.full(settings.topic_prefix)
    consumer = AIOKafkaConsumer(**settings.kafka_client_args(), enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(DRAIN.partitions)])
        await consumer.seek_to_end()
        async with Publisher(settings, client_id="fleetpulse-up-bot") as pub:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    for record in records:
                        try:
                            event = decode(record.value)
                            if type(event) is dict and {"event_id", "host", "action", "ts"} <= event.keys():
                                wait = bot.delay(event) / speed if speed > 0 else 0.0  # speed 0: flat out
                                bot.receive(event, release_at=time.monotonic() + wait)
                        except (DecodeError, ValueError, TypeError, KeyError) as exc:
                            # the sink dead-letters what it cannot store; a bot skips what it cannot act on
                            log.warning("simulated bot: skipped %s[%d]@%d: %s", record.topic, record.partition,
                                        record.offset, exc)
                for result in bot.due(time.monotonic()):
                    await pub.send(REMEDIATION, result)
                await pub.flush()
    finally:
        await consumer.stop()
    return sum(bot.answered.values())
