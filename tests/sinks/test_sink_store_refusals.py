"""The sink while the store refuses its inserts for a while, on the real broker and a real ClickHouse: the engine's own
TOO_MANY_PARTS (code 252, brought on by lowering the table's `parts_to_throw_insert` to 1), and, on the project's
server, the writer's insert quota used up (QUOTA_EXCEEDED). Waiting mends both: the sink holds its batch, says what it
waits for, never gives up (it once stopped after 8 tries, 33 s), commits nothing it did not store, and once the store
takes inserts again stores every record once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from core.clickhouse import connect
from core.settings import CommonSettings, load
from fleetpulse.clickhouse_server import LocalClickHouse, Quota
from schemas.provision import ensure_topics
from schemas.topics import XID
from sinks import store
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.conftest import free_ports
from tests.streams.helpers import until

pytestmark = pytest.mark.integration
ROUND = 20  # XID lines per round
REFUSED_FOR_S = 40  # longer than the retries the sink once gave up after


async def send_xids(settings: CommonSettings, first: int, count: int, now: float) -> None:
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for n in range(first, first + count):
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


async def committed(settings: CommonSettings) -> dict[int, int]:
    """The sink group's commit per partition of the XID topic."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_args())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.topic_prefix + "fleetpulse-sink")
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == XID.full(settings.topic_prefix)}


def stored_next(client) -> dict[int, int]:
    """Per partition, the offset after the last one stored."""
    rows = client.query("SELECT kafka_partition, max(kafka_offset) + 1 FROM xid_events GROUP BY kafka_partition")
    return dict(rows.result_rows)


@contextlib.asynccontextmanager
async def running(settings: SinkSettings, caplog):
    """A sink running on `settings` (its task beside it, its tables made), its warnings captured; stopped cleanly after:
    it never stopped on its own."""
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))
    try:
        with caplog.at_level(logging.WARNING, logger="fleetpulse.sink"):
            await until(lambda: sink.stats.ready or task.done(), 60.0, every=0.1, what="the sink started")
            yield sink, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_too_many_parts_is_waited_out_however_long_it_lasts(settings_env, caplog):
    settings = load(SinkSettings, sink_tables=["xid_events"], sink_http=False, sink_batch_max_seconds=0.2,
                    sink_wait_max_s=2.0)
    client, now = connect(settings, "owner"), time.time() - 600
    async with running(settings, caplog) as (sink, task):
        await send_xids(settings, 0, ROUND, now)
        await until(lambda: stored(client) == (ROUND, ROUND) or task.done(), 60.0, every=0.1,
                    what="the first round stored")

        refuse(client, settings, True)
        await send_xids(settings, ROUND, ROUND, now)
        await until(lambda: sink.outages.waiting or task.done(), 60.0, every=0.1, what="a refused insert")
        began = time.monotonic()
        while time.monotonic() - began < REFUSED_FOR_S:
            assert not task.done() and sink.outages.waiting and stored(client) == (ROUND, ROUND)
            held = stored_next(client)  # nothing committed past what is stored
            assert all(offset <= held.get(p, 0) for p, offset in (await committed(settings)).items())
            await asyncio.sleep(1.0)
        state = sink.stats.as_dict()["store"]
        assert state["waiting"] and state["current"]["error"] == "TOO_MANY_PARTS", state
        assert state["current"]["for_s"] >= REFUSED_FOR_S and state["current"]["tries"] >= REFUSED_FOR_S // 2
        refuse(client, settings, False)
        await until(lambda: stored(client) == (2 * ROUND, 2 * ROUND) or task.done(), 60.0, every=0.1,
                    what="the second round stored")
        deadline = time.monotonic() + 30
        while await committed(settings) != stored_next(client):
            assert time.monotonic() < deadline, f"committed {await committed(settings)}, " \
                                                f"stored {stored_next(client)}"
            await asyncio.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    began = "the store is not taking writes (insert into xid_events failed: "
    assert sum(line.startswith(began) for line in lines) == 1
    assert any(line.startswith("the store takes writes again after ") for line in lines)
    assert not sink.outages.waiting and sink.outages.count == 1
    assert stored(client) == (2 * ROUND, 2 * ROUND)
    print(f"\nrefused for {sink.outages.waited_s:.1f} s, {sink.outages.by_error} failed tries; every record once")


@pytest.mark.slow
async def test_an_insert_quota_used_up_is_waited_out(kafka_bootstrap, topic_prefix, tmp_path, caplog):
    base = free_ports(2)
    server = LocalClickHouse(tmp_path / "ch", http_port=base, tcp_port=base + 1,
                             quotas=(Quota("writer", interval_s=10, inserts=12),))
    server.start()
    try:
        users = {f"clickhouse_{role}_{what}": (user if what == "user" else server.password(role))
                 for role, (user, _) in server.users.items() for what in ("user", "password")}
        settings = SinkSettings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix,
                                clickhouse_url=server.url, clickhouse_database="quota", sink_tables=["xid_events"],
                                sink_http=False, sink_batch_max_seconds=0.1, sink_wait_max_s=1.0, **users)
        client, now = connect(settings, "owner"), time.time() - 600
        async with running(settings, caplog) as (sink, task):
            # one record every 0.15 s: a batch (two inserts: its in-flight record and its rows) each; the quota takes
            # 12 inserts per 10 s
            for n in range(120):
                await send_xids(settings, n, 1, now)
                await asyncio.sleep(0.15)
                assert not task.done()
            await until(lambda: stored(client) == (120, 120) or task.done(), 120.0, every=0.2,
                        what="every record stored")
        assert "QUOTA_EXCEEDED" in sink.outages.by_error and sink.outages.count >= 1, sink.outages.state()
        assert any("Quota for user" in r.getMessage() for r in caplog.records)
        assert stored(client) == (120, 120)
        print(f"\nquota: {sink.outages.count} outages, {sink.outages.by_error}, waited {sink.outages.waited_s:.1f} s")
    finally:
        server.stop()
