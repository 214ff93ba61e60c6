"""The sink while the store refuses its inserts, on the real broker and the real ClickHouse engine: the engine's own
TOO_MANY_PARTS (code 252, which waiting mends), brought on by lowering the table's `parts_to_throw_insert` to 1.

Refused for a while, the sink retries with backoff (sinks/runner.py insert_with_retry) and, once the store takes
inserts again, stores every record once. Refused past its retries, it stops with the error, having committed nothing it
did not store, and the next sink stores the rest once. Not a server that stops answering (no ClickHouse server can run
here; docs/cluster.md): the same retry path, entered by an engine error instead of a dropped connection."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from core.errors import StoreError
from core.settings import load
from schemas.provision import ensure_topics
from schemas.topics import XID
from sinks import store
from sinks.cli import run_sink
from sinks.runner import ClickHouseSink
from sinks.settings import SinkSettings
from tests.streams.helpers import until

pytestmark = pytest.mark.integration
ROUND = 20  # XID lines per round
RETRIES = 6  # backoff 0.2 s doubling: 12.6 s of refusals before a sink gives up


async def send_xids(settings: SinkSettings, first: int, now: float) -> None:
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for n in range(first, first + ROUND):
            host = f"h{n % 5}"
            line = {"host": host, "ts": now + n, "code": 79, "gpu_index": n % 8, "message": "fallen off the bus"}
            await producer.send(XID.full(settings.topic_prefix), orjson.dumps(line), key=host.encode())
        await producer.flush()
    finally:
        await producer.stop()


def stored(client) -> tuple[int, int]:
    """Rows of xid_events, and the distinct records (partition, offset) among them."""
    [row] = client.query("SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM xid_events").result_rows
    return row


def refuse(client, settings: SinkSettings, refusing: bool) -> None:
    """The table (on a cluster: its local tables) refuses every insert while it holds a part (TOO_MANY_PARTS), or
    takes them again."""
    shape = store.layout(settings)
    change = "MODIFY SETTING parts_to_throw_insert = 1" if refusing else "RESET SETTING parts_to_throw_insert"
    client.command(f"ALTER TABLE {shape.local('xid_events')}{shape.on} {change}")


async def committed(settings: SinkSettings) -> dict[int, int]:
    """The sink group's commit per partition of the XID topic."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_args())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.topic_prefix + settings.sink_group_id)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == XID.full(settings.topic_prefix)}


def stored_next(client) -> dict[int, int]:
    """Per partition, the offset after the last one stored."""
    rows = client.query("SELECT kafka_partition, max(kafka_offset) + 1 FROM xid_events GROUP BY kafka_partition")
    return dict(rows.result_rows)


def retried(caplog) -> int:
    return sum("retryable insert failure" in r.getMessage() for r in caplog.records)


async def test_a_store_that_refuses_inserts_loses_and_doubles_nothing(settings_env, caplog):
    settings = load(SinkSettings, sink_tables=["xid_events"], sink_serve_queries=False, sink_batch_max_seconds=0.2,
                    sink_insert_retries=RETRIES)
    client, now = store.connect(settings), time.time() - 600
    stop = asyncio.Event()
    task = asyncio.create_task(run_sink(ClickHouseSink(settings), stop))
    try:
        with caplog.at_level(logging.WARNING, logger="fleetpulse.sink"):
            await send_xids(settings, 0, now)
            await until(lambda: stored(client) == (ROUND, ROUND) or task.done(), 60.0, every=0.1,
                        what="the first round stored")

            # Refused for a while, then taken: every record once.
            refuse(client, settings, True)
            await send_xids(settings, ROUND, now)
            await until(lambda: retried(caplog) > 0 or task.done(), 60.0, every=0.1, what="a refused insert")
            assert stored(client) == (ROUND, ROUND) and not task.done()
            refuse(client, settings, False)
            await until(lambda: stored(client) == (2 * ROUND, 2 * ROUND) or task.done(), 60.0, every=0.1,
                        what="the second round stored")
            before = retried(caplog)

            # Refused past the retries: the sink stops with the error, commits nothing it did not store.
            refuse(client, settings, True)
            await send_xids(settings, 2 * ROUND, now)
            with pytest.raises(StoreError, match="TOO_MANY_PARTS"):
                await asyncio.wait_for(task, 60)
        assert retried(caplog) - before == RETRIES  # tried RETRIES + 1 times in all
    finally:
        stop.set()
        if not task.done():
            task.cancel()
    assert stored(client) == (2 * ROUND, 2 * ROUND)
    held = stored_next(client)
    assert all(offset <= held.get(p, 0) for p, offset in (await committed(settings)).items())

    # The next sink, on a store that takes inserts again, stores the rest once, and commits every partition up to
    # what it stored (the failed batch is stored again from its record, sinks/inflight.py, and read past).
    refuse(client, settings, False)
    stop = asyncio.Event()
    task = asyncio.create_task(run_sink(ClickHouseSink(settings), stop))
    try:
        await until(lambda: stored(client) == (3 * ROUND, 3 * ROUND) or task.done(), 60.0, every=0.1,
                    what="the third round stored")
        deadline = time.monotonic() + 30
        while await committed(settings) != stored_next(client) and not task.done():
            assert time.monotonic() < deadline, f"committed {await committed(settings)}, stored {stored_next(client)}"
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert stored(client) == (3 * ROUND, 3 * ROUND)
    assert await committed(settings) == stored_next(client)
    print(f"\n{before} retried inserts before the store took them again; {RETRIES + 1} tries before giving up")
