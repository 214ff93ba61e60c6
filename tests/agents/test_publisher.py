"""The Kafka publisher against a real broker: keys, topic namespace, zstd, bulk delivery counts."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from agents.publisher import Publisher
from core.errors import BrokerError
from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.events import XidEvent
from schemas.topics import NCCL, SAMPLES, XID, Topic


async def consume_all(settings: CommonSettings, topic: Topic, expected: int, timeout: float = 30.0) -> list:
    """Every record of a topic (all partitions, from the start); waits for `expected`, then a quiet second more."""
    consumer = AIOKafkaConsumer(topic.full(settings.topic_prefix), **settings.kafka_client_args(), group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < expected:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
        for batch in (await consumer.getmany(timeout_ms=1000)).values():
            records.extend(batch)  # anything beyond `expected` would be a duplicate
    finally:
        await consumer.stop()
    return records


def test_send_before_start_is_an_error():
    pub = Publisher(CommonSettings())
    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(pub.send(SAMPLES, {"host": "h"}))


@pytest.mark.integration
async def test_publisher_delivers_keyed_zstd_records_under_the_prefix(settings_env):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    event = XidEvent(host="gpu-node-0007", ts=1_700_000_000.0, code=79,
                     raw_line="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    async with Publisher(settings, max_pending=50) as pub:
        await pub.send(XID, event)
        for i in range(120):
            await pub.send(NCCL, {"job": f"job-{i % 3:04d}", "rank": i, "value": "x" * 200})
        assert pub.pending < 50  # flushed on its own once max_pending were outstanding
        await pub.flush()
        assert pub.pending == 0
        assert pub.sent == {"fleet.telemetry.xid": 1, "fleet.telemetry.nccl": 120}
    xids = await consume_all(settings, XID, 1)
    assert [(r.key, orjson.loads(r.value)) for r in xids] == [(b"gpu-node-0007", event.model_dump(mode="json"))]
    nccl = await consume_all(settings, NCCL, 120)
    assert len(nccl) == 120
    partitions = {}
    for r in nccl:
        partitions.setdefault(r.key, set()).add(r.partition)
    assert set(partitions) == {b"job-0000", b"job-0001", b"job-0002"}
    assert all(len(p) == 1 for p in partitions.values())  # keyed: one job, one partition


@pytest.mark.integration
async def test_a_refused_record_is_counted_and_raised_and_the_rest_still_goes(settings_env):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    async with Publisher(settings, max_request_size=4096) as pub:
        with pytest.raises(BrokerError, match="record refused") as err:
            await pub.send(SAMPLES, {"host": "gpu-node-0000", "blob": "y" * 10_000})
        assert err.value.retryable is False
        await pub.send(SAMPLES, {"host": "gpu-node-0001", "blob": "small"})
    assert pub.failed == {"fleet.telemetry.samples": 1} and pub.sent == {"fleet.telemetry.samples": 1}
    assert [r.key for r in await consume_all(settings, SAMPLES, 1)] == [b"gpu-node-0001"]
