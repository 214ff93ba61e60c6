"""The sink on a real broker and the real ClickHouse engine: exactly once, replay-safe, poison to the DLQ."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from core.errors import StoreError
from core.kafka_admin import delete_prefixed
from schemas.provision import ensure_topics
from schemas.rollups import ROLLUPS
from core.settings import load
from schemas.codec import encode
from schemas.dead_letter import original
from schemas.events import XidEvent
from schemas.telemetry import GpuReading, HostSample
from schemas.topics import SAMPLES, XID
from schemas.tables import TABLES
from core.clickhouse import connect
from sinks import store
from sinks.batch import Batch
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.streams.broker import read_all

pytestmark = pytest.mark.integration


def sample(host: int, seq: int, now: float) -> HostSample:
    gpus = [
        GpuReading(index=i, uuid=f"GPU-{host:04d}-{i}", pci_bus_id=f"0000:{0x18 + i:02x}:00.0", model="NVIDIA H100",
                   power_w=300.0 + host + i + seq / 8, gpu_temp_c=40.0 + i, energy_mj=1000 * seq + i)
        for i in range(8)
    ]
    return HostSample(host=f"h{host:03d}", rack=f"r{host // 4}", cluster="c1", ts=now + seq, seq=seq, gpus=gpus)


async def produce(settings: SinkSettings, values: list[bytes | HostSample]) -> None:
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for v in values:
            raw = encode(v) if isinstance(v, HostSample) else v
            key = v.host.encode() if isinstance(v, HostSample) else b"poison"
            await producer.send(SAMPLES.full(settings.topic_prefix), raw, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def sink_until(settings: SinkSettings, done, timeout: float = 60.0) -> ClickHouseSink:
    """Run the sink until done(sink) holds (or time runs out), then stop it cleanly."""
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not task.done() and not done(sink):
        await asyncio.sleep(0.2)
    stop.set()
    return await asyncio.wait_for(task, 30)


async def read_dead_letters(settings: SinkSettings, topic) -> list[tuple[dict, bytes | None]]:
    return [original(r.value) for r in await read_all(settings.bootstrap, topic.dlq(settings.topic_prefix), 1)]


def rows_in(settings: SinkSettings, sql: str):
    return connect(settings, "owner").query(sql).result_rows


@pytest.fixture
def settings(settings_env) -> SinkSettings:
    return load(SinkSettings, sink_batch_max_seconds=0.3, sink_http=False)


async def test_a_run_of_known_size_lands_exactly_once_and_replays_add_nothing(settings):
    now = time.time()
    samples = [sample(h, s, now) for s in range(15) for h in range(12)]
    await produce(settings, samples)
    expected_rows = len(samples) * 8
    power_sum = sum(g.power_w for s in samples for g in s.gpus)
    energy_sum = sum(g.energy_mj for s in samples for g in s.gpus)

    await sink_until(settings, lambda s: s.stats.tables["gpu_samples"].rows >= expected_rows)
    check = "SELECT count(), sum(power_w), sum(energy_mj), uniqExact(host, seq, gpu_index) FROM gpu_samples"
    assert rows_in(settings, check) == [(expected_rows, pytest.approx(power_sum, rel=1e-12), energy_sum, expected_rows)]
    # Every row carries where it came from: partition, offset and the record's Kafka timestamp.
    provenance = "SELECT uniqExact(kafka_partition, kafka_offset), toUnixTimestamp64Milli(min(kafka_ts)) FROM gpu_samples"
    distinct_records, first_ms = rows_in(settings, provenance)[0]
    assert distinct_records == len(samples) and abs(first_ms / 1000 - now) < 120

    # The rollups saw every row once: each GPU's energy rose 1 kJ a sample, 14 kJ over its 15 samples.
    rollups = "SELECT sum(samples), sum(energy_j), (SELECT sum(gpu_samples) FROM fleet_1d) FROM gpu_1m"
    assert rows_in(settings, rollups) == [(expected_rows, 12 * 8 * 14.0, expected_rows)]

    # Same group again: offsets were committed after the insert, nothing new to read.
    same = await sink_until(settings, lambda s: False, timeout=4)
    assert same.stats.tables["gpu_samples"].records == 0
    # A new consumer group starts from the earliest offset; the stored watermarks skip what is already there.
    again = settings.model_copy(update={"sink_group_id": "replay-group"})
    replayed = await sink_until(again, lambda s: False, timeout=6)
    assert replayed.stats.tables["gpu_samples"].rows == replayed.stats.tables["gpu_samples"].records == 0
    # (records it did fetch before its seek took effect are counted as already stored, never inserted)
    assert rows_in(settings, check)[0][0] == expected_rows
    assert rows_in(settings, rollups) == [(expected_rows, 12 * 8 * 14.0, expected_rows)]


async def test_a_sink_stopped_between_an_insert_and_its_views_stores_the_rest_and_nothing_twice(settings):
    """The crash the in-flight record is for (sinks/inflight.py): the raw part written, the watermark and rollup views'
    parts not. Reading on from Kafka's commit would store the raw rows twice under other tokens; from the watermark,
    the rollups would lose them."""
    client = connect(settings, "owner")
    store.apply_schema(client, settings)
    now = time.time()
    samples = [sample(h, s, now) for s in range(5) for h in range(6)]
    await produce(settings, samples)
    table, topic = TABLES["gpu_samples"], SAMPLES.full(settings.topic_prefix)
    batch = Batch(table, topic)
    for rec in await read_all(settings.bootstrap, topic, SAMPLES.partitions):
        batch.add(rec.partition, rec.offset, table.rows(orjson.loads(rec.value), rec.partition, rec.offset,
                                                        rec.timestamp))
    store.record_inflight(client, topic, batch.token(), 0, batch.ranges)
    views = ["gpu_samples_watermark_mv"] + [v for r in ROLLUPS.values() if r.source == "gpu_samples"
                                            for v in r.view_names()]
    for view in views:
        client.command(f"DETACH TABLE {view}")
    store.insert(client, "gpu_samples", table.column_names, batch.rows, batch.token())  # ... and then it was killed
    for view in views:
        client.command(f"ATTACH TABLE {view}")
    assert store.watermarks(client) == {} and rows_in(settings, "SELECT count() FROM gpu_1m") == [(0,)]

    sink = await sink_until(settings, lambda s: False, timeout=8)
    expected = len(samples) * 8
    assert sink.stats.tables["gpu_samples"].stored_again == 1  # its raw part a deduplicated no-op, its views written
    assert rows_in(settings, "SELECT count(), uniqExact(host, seq, gpu_index) FROM gpu_samples") == [(expected,) * 2]
    assert rows_in(settings, "SELECT sum(samples), (SELECT sum(gpu_samples) FROM fleet_1d) FROM gpu_1m") == \
        [(expected, expected)]
    assert sum(1 for (t, _), _ in store.watermarks(client).items() if t == topic) == len(batch.ranges)


async def test_poison_records_go_to_the_dead_letter_topic_and_the_sink_goes_on(settings):
    now = time.time()
    good = [sample(h, s, now) for s in range(3) for h in range(4)]
    poison = [b"{not json", orjson.dumps({"host": "h9", "ts": now, "seq": 1, "gpus": [{"index": "zero"}]})]
    await produce(settings, good[:6] + poison + good[6:])

    await sink_until(settings, lambda s: s.stats.tables["gpu_samples"].rows >= len(good) * 8
                     and s.stats.tables["gpu_samples"].dead_letters >= 2)
    assert rows_in(settings, "SELECT count() FROM gpu_samples") == [(len(good) * 8,)]

    letters = await read_dead_letters(settings, SAMPLES)
    assert len(letters) == 2
    reasons = [facts["reason"] for facts, _ in letters]
    assert reasons[0].startswith("not JSON")
    assert "Expected `int`, got `str` - at `$.gpus[0].index`" in reasons[1]  # the samples topic's validator
    assert [raw for _, raw in letters] == poison
    assert all(facts["source_topic"] == SAMPLES.full(settings.topic_prefix) for facts, _ in letters)


async def test_a_column_the_schemas_gained_is_added_to_an_old_table_in_its_place(settings):
    client = connect(settings, "owner")
    store.apply_schema(client, settings)
    client.command("ALTER TABLE sim_truth DROP COLUMN cause")  # a store from before InjectedFault.cause
    for rollup in ROLLUPS.values():  # and before the rollups, which read hbm_temp_c
        for view in rollup.view_names():
            client.command(f"DROP VIEW {view}")
        client.command(f"DROP TABLE {rollup.name}")
    client.command("ALTER TABLE gpu_samples DROP COLUMN hbm_temp_c")
    # a scaled field comes as two columns: the stored integer and the alias that reads it in its unit
    client.command("ALTER TABLE gpu_samples DROP COLUMN power_default_limit_w")
    client.command("ALTER TABLE gpu_samples DROP COLUMN power_default_limit_mw")
    sink = ClickHouseSink(settings)
    await sink.open_store()
    assert store.schema_drift(client, settings.clickhouse_database) == []
    assert set(ROLLUPS) <= {name for (name,) in client.query("SHOW TABLES").result_rows}
    assert store.add_missing_columns(client, settings.clickhouse_database) == []  # nothing left to add


async def test_live_table_drift_stops_the_sink_at_start(settings):
    client = connect(settings, "owner")
    store.apply_schema(client, settings)
    client.command("ALTER TABLE gpu_samples MODIFY COLUMN hbm_temp_c Nullable(Float32)")
    from core.errors import StoreError

    with pytest.raises(StoreError, match="gpu_samples"):
        await run_sink(ClickHouseSink(settings), asyncio.Event())



async def test_a_record_the_store_refuses_is_dead_lettered_once_and_the_rest_of_its_batch_is_stored(settings):
    # A constraint the operator added: the real engine refuses the rows that break it, whole inserts at a time. It names
    # the stored column: an ALIAS (power_w) is not there when a constraint is checked.
    client = connect(settings, "owner")
    store.apply_schema(client, settings)
    client.command("ALTER TABLE gpu_samples ADD CONSTRAINT no_999_watts CHECK power_mw IS NULL OR power_mw != 999000")
    now = time.time()
    good = [sample(h, s, now) for s in range(6) for h in range(10)]
    bad = [sample(20 + k, 0, now) for k in range(3)]
    for k, s in enumerate(bad):
        s.gpus[k].power_w = 999.0
    await produce(settings, good[:20] + bad[:1] + good[20:40] + bad[1:] + good[40:])
    slow = settings.model_copy(update={"sink_periodic_batch_max_seconds": 5.0})  # all of it in one or two batches

    sink = await sink_until(slow, lambda s: s.stats.tables["gpu_samples"].rows >= len(good) * 8
                            and s.stats.tables["gpu_samples"].dead_letters >= len(bad))
    stats = sink.stats.tables["gpu_samples"]
    assert (stats.rows, stats.dead_letters) == (len(good) * 8, len(bad)) and stats.split_batches >= 1
    assert rows_in(settings, "SELECT count(), uniqExact(host, seq) FROM gpu_samples") == [(len(good) * 8, len(good))]
    letters = await read_dead_letters(settings, SAMPLES)
    assert sorted(HostSample.model_validate_json(raw).host for _, raw in letters) == ["h020", "h021", "h022"]
    assert all("VIOLATED_CONSTRAINT" in facts["reason"] and facts["component"] == "sink" for facts, _ in letters)
    # A restart stores nothing twice and dead-letters nothing again.
    again = await sink_until(slow, lambda s: False, timeout=4)
    assert again.stats.tables["gpu_samples"].dead_letters == 0 and again.stats.tables["gpu_samples"].rows == 0
    assert rows_in(settings, "SELECT count() FROM gpu_samples") == [(len(good) * 8,)]


async def test_a_record_the_engine_cannot_parse_but_the_checks_pass_is_stored_from_python_not_dead_lettered(settings):
    """A key given twice: the samples topic's validator takes the last (as every JSON reader in the pipeline does),
    ClickHouse's JSON parser refuses the line. The sink stores that record's rows from Python instead (its
    extraction reads the record the way the validator did): what the stream worker accepts, the sink stores."""
    now = time.time()
    good = [sample(h, 0, now) for h in range(12)]
    twice = sample(50, 0, now)
    raw = b'{"rack":"first",' + encode(twice)[1:]  # the record's own "rack" (r12) comes after: it is the one read
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    await produce(settings, good[:6])
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(SAMPLES.full(settings.topic_prefix), raw, key=twice.host.encode())
    finally:
        await producer.stop()
    await produce(settings, good[6:])
    slow = settings.model_copy(update={"sink_periodic_batch_max_seconds": 5.0})
    sink = await sink_until(slow, lambda s: s.stats.tables["gpu_samples"].rows >= 13 * 8)
    stats = sink.stats.tables["gpu_samples"]
    assert (stats.rows, stats.dead_letters, stats.split_batches) == (13 * 8, 0, 0)  # one more insert, no halving
    assert rows_in(settings, "SELECT DISTINCT rack FROM gpu_samples WHERE host = 'h050'") == [("r12",)]
    assert rows_in(settings, "SELECT count(), uniqExact(host, gpu_index) FROM gpu_samples") == [(13 * 8, 13 * 8)]


async def test_a_rebalance_that_flushes_while_the_main_loop_flushes_stores_and_commits_each_batch_once(settings):
    """aiokafka runs the rebalance listener (flush_all) in a task of its own: it can flush while the main loop waits
    for the batch before to be stored. Each batch is then stored once and its offsets committed in order, and the
    records fetched before the revocation are not taken after it."""
    now = time.time() - 60
    samples = [sample(h, s, now) for s in range(10) for h in range(8)]
    await produce(settings, samples)
    sink = ClickHouseSink(settings.model_copy(update={"sink_periodic_batch_max_seconds": 60.0}))
    await sink.start()
    try:
        chunks, deadline = [], time.monotonic() + 60
        while sum(len(r) for _, r in chunks) < len(samples) and time.monotonic() < deadline:
            chunks += list((await sink.consumer.getmany(timeout_ms=500)).items())
        batch = sink.batches[SAMPLES.full(settings.topic_prefix)]
        for tp, records in chunks:
            await sink.take(tp, records[:len(records) // 2], sink.generation)
        await sink.flush(batch)  # stored while the rest is taken
        for tp, records in chunks:
            await sink.take(tp, records[len(records) // 2:], sink.generation)
        await asyncio.gather(sink.flush(batch), sink.flush_all())  # the main loop's flush and the listener's at once
        assert sink.stats.tables["gpu_samples"].batches == 2
        ends = await sink.consumer.end_offsets([tp for tp, _ in chunks])
        assert {tp: await sink.consumer.committed(tp) for tp, _ in chunks} == ends
        stale = sink.generation
        sink.generation += 1  # a revocation since these were fetched: not the sink's to take any more
        await sink.take(*chunks[0], stale)
        assert batch.empty

        async def lost():
            raise StoreError("insert into gpu_samples failed: no such table")
        sink.pending = asyncio.create_task(lost())
        with pytest.raises(StoreError):
            await sink.flush_all()  # the listener sees the failure first (aiokafka only logs what it raises) ...
        with pytest.raises(StoreError):
            await sink.settle()  # ... and the main loop still stops on it: no later batch's offsets go past it
    finally:
        await sink.close()
    assert rows_in(settings, "SELECT count(), uniqExact(host, seq, gpu_index) FROM gpu_samples") == \
        [(len(samples) * 8, len(samples) * 8)]


@pytest.mark.slow
async def test_a_sink_away_longer_than_its_session_goes_on_and_stores_everything_once(settings):
    """A sink whose process stalls between storing a batch and committing it (stopped, paused, starved: here its
    event loop blocked past the group's 10 s session) finds the group rebalanced and its commit refused. The rows are
    stored; it goes on, resumes after them, and every record lands once. (Seen when a fleet-scale run stopped the
    sink for 3 minutes: it stopped on CommitFailedError.)"""
    now = time.time() - 60
    first = [sample(h, s, now) for s in range(5) for h in range(8)]
    await produce(settings, first)
    sink = ClickHouseSink(settings)
    store_batch, stalled = sink.store_batch, []

    async def store_then_stall(batch):
        if not stalled:
            stalled.append(batch.table.name)
            real = sink.inserter.store

            async def stored_then_away(b):
                rows = await real(b)
                time.sleep(13)  # the whole process away: no heartbeat, the broker expels the member
                return rows
            sink.inserter.store = stored_then_away
            try:
                return await store_batch(batch)
            finally:
                sink.inserter.store = real
        return await store_batch(batch)

    sink.store_batch = store_then_stall
    stop = asyncio.Event()
    task = asyncio.create_task(sink.run(stop))
    try:
        deadline = time.monotonic() + 90
        while sink.stats.tables["gpu_samples"].commits_lost == 0 and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.2)
        assert sink.stats.tables["gpu_samples"].commits_lost == 1, sink.stats.tables["gpu_samples"].as_dict()
        second = [sample(h, s, now) for s in range(5, 10) for h in range(8)]
        await produce(settings, second)
        want = (len(first) + len(second)) * 8
        while rows_in(settings, "SELECT count() FROM gpu_samples")[0][0] < want and time.monotonic() < deadline:
            assert not task.done(), task
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert rows_in(settings, "SELECT count(), uniqExact(host, seq, gpu_index) FROM gpu_samples") == [(want, want)]
    after = await sink_until(settings, lambda s: False, timeout=4)  # the group's commits reached the end
    assert after.stats.tables["gpu_samples"].records == 0


async def test_a_table_that_refuses_every_record_dead_letters_them_all_and_says_the_table_may_be_at_fault(
        settings, caplog):
    client = connect(settings, "owner")
    store.apply_schema(client, settings)
    client.command("ALTER TABLE gpu_samples ADD CONSTRAINT nothing CHECK power_mw IS NULL")
    samples = [sample(h, 0, time.time()) for h in range(4)]
    await produce(settings, samples)
    slow = settings.model_copy(update={"sink_periodic_batch_max_seconds": 3.0})  # the four in one batch
    with caplog.at_level(logging.ERROR, logger="fleetpulse.sink"):
        sink = await sink_until(slow, lambda s: s.stats.tables["gpu_samples"].dead_letters >= len(samples))
    assert (sink.stats.tables["gpu_samples"].rows, sink.stats.tables["gpu_samples"].dead_letters) == (0, 4)
    assert len(await read_dead_letters(settings, SAMPLES)) == 4
    assert any("refused every one of 4 records" in r.getMessage() for r in caplog.records)


async def test_an_event_is_stored_at_the_event_wait_while_the_samples_beside_it_gather_for_the_periodic_one(
        settings):
    # A host's sample and an XID reach the sink together: the XID's batch is due after 0.2 s, the samples' (a
    # periodic stream, every host every interval) after 4 s, so the XID is in the store while the sample still waits.
    now = time.time() - 30
    await produce(settings, [sample(1, 0, now)])
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(XID.full(settings.topic_prefix), encode(XidEvent(
            host="h001", ts=now, code=79, gpu_index=0, message="fell off the bus")), key=b"h001")
    finally:
        await producer.stop()
    split = settings.model_copy(update={"sink_batch_max_seconds": 0.2, "sink_periodic_batch_max_seconds": 4.0})
    seen = {}

    def stored(sink: ClickHouseSink) -> bool:
        xid, gpu = sink.stats.tables["xid_events"], sink.stats.tables["gpu_samples"]
        if xid.rows and "gpu_rows_then" not in seen:
            seen["gpu_rows_then"], seen["xid_at"] = gpu.rows, time.monotonic()
        if gpu.rows and "gpu_at" not in seen:
            seen["gpu_at"] = time.monotonic()
        return "gpu_at" in seen and "xid_at" in seen

    sink = await sink_until(split, stored)
    assert sink.stats.tables["xid_events"].rows == 1 and sink.stats.tables["gpu_samples"].rows == 8
    assert seen["gpu_rows_then"] == 0  # the XID was stored first ...
    assert seen["gpu_at"] - seen["xid_at"] > 2.0, seen  # ... seconds before the sample's batch was due


async def test_xids_spanning_more_days_than_one_insert_may_touch_are_all_stored(settings):
    # One valid XID per day for 150 days: past the partitions one insert may take (ClickHouse's default 100 used to
    # stop the sink for good); the sink inserts such a batch in parts.
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    day, start = 86_400.0, time.time() - 200 * 86_400.0
    xids = [XidEvent(host="h1", ts=start + k * day, code=79, gpu_index=k % 8, message="fell off the bus")
            for k in range(150)]
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for x in xids:
            await producer.send(XID.full(settings.topic_prefix), encode(x), key=b"h1", partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    few = settings.model_copy(update={"sink_batch_max_seconds": 5.0, "sink_max_partitions_per_insert": 40,
                                      "sink_tables": ["xid_events"]})
    sink = await sink_until(few, lambda s: s.stats.tables["xid_events"].rows >= len(xids))
    stats = sink.stats.tables["xid_events"]
    assert (stats.rows, stats.dead_letters) == (len(xids), 0) and stats.split_batches >= 1
    assert rows_in(settings, "SELECT count(), uniqExact(toDate(ts)) FROM xid_events") == [(150, 150)]


async def test_a_recreated_topic_is_stored_from_its_start_not_skipped_as_already_stored(settings, caplog):
    """A store outlives its broker (a wiped dev broker, a topic deleted and made again): the new topic's offsets start
    at 0 again, below the store's watermarks, and would all be skipped as replays. The sink sees that a partition ends
    below what the store says it holds, records the reset and stores the new records; a rerun adds nothing."""
    now = time.time()
    first = [sample(h, s, now) for s in range(6) for h in range(8)]
    await produce(settings, first)
    await sink_until(settings, lambda s: s.stats.tables["gpu_samples"].rows >= len(first) * 8)

    await delete_prefixed(settings.kafka_client_args(), settings.topic_prefix)
    await gone(settings, SAMPLES.full(settings.topic_prefix))
    second = [sample(h, s, now + 100) for s in range(2) for h in range(8)]  # fewer records than the first topic held
    await produce(settings, second)
    with caplog.at_level(logging.WARNING, logger="fleetpulse.sink"):
        after = await sink_until(settings, lambda s: s.stats.tables["gpu_samples"].rows >= len(second) * 8, timeout=30)
    assert after.stats.tables["gpu_samples"].rows == len(second) * 8
    assert rows_in(settings, "SELECT count(), uniqExact(host, seq, ts, gpu_index) FROM gpu_samples") == \
        [((len(first) + len(second)) * 8,) * 2]
    resets = rows_in(settings, "SELECT topic, partition, stored_before, log_end FROM sink_topic_resets")
    topic = SAMPLES.full(settings.topic_prefix)
    assert resets and all(t == topic and stored >= end for t, _, stored, end in resets)
    assert any("was recreated" in r.getMessage() for r in caplog.records)

    again = settings.model_copy(update={"sink_group_id": "replay-group"})  # reads the new topic from its start
    await sink_until(again, lambda s: False, timeout=6)
    assert rows_in(settings, "SELECT count() FROM gpu_samples") == [((len(first) + len(second)) * 8,)]
    assert rows_in(settings, "SELECT count() FROM sink_topic_resets") == [(len(resets),)]  # no second reset


async def gone(settings: SinkSettings, topic: str, timeout: float = 30.0) -> None:
    """Wait until the broker no longer lists `topic` (deletion is asynchronous)."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_args())
    await admin.start()
    try:
        deadline = time.monotonic() + timeout
        while topic in await admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} still listed {timeout:g} s after its deletion"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
