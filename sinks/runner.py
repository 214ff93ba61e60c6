"""The sink loop: consume, decode to rows, insert per table, then commit; bad records to the dead-letter topic."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from core.errors import DecodeError, StoreError
from core.logs import LogBudget
from schemas.provision import ensure_topics
from schemas.dead_letter import dead_letter
from schemas.json_intake import INTAKES
from schemas.tables import TABLES, Table
from sinks import inflight, store
from sinks.batch import Batch, Entry
from sinks.query_guard import QueryLimits
from sinks.settings import SinkSettings

log = logging.getLogger("fleetpulse.sink")


@dataclass
class TableStats:
    rows: int = 0
    records: int = 0
    batches: int = 0
    dead_letters: int = 0
    last_insert_ms: float = 0.0
    already_stored: int = 0  # replayed records at or below the stored watermark: skipped, still committed
    split_batches: int = 0  # batches the store refused whole, inserted in parts around the records at fault
    topic_resets: int = 0  # partitions found recreated (log end at or below the stored watermark): read as new
    stored_again: int = 0  # last batches before a stop, inserted again at start with their token (sinks/inflight.py)


@dataclass
class SinkStats:
    tables: dict[str, TableStats] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    ready: bool = False

    def as_dict(self) -> dict:
        return {
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "tables": {name: vars(s) for name, s in self.tables.items()},
        }


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, sink: ClickHouseSink):
        self.sink = sink

    async def on_partitions_revoked(self, revoked):
        self.sink.generation += 1  # what the main loop fetched before this is no longer its to take
        await self.sink.flush_all()

    async def on_partitions_assigned(self, assigned):
        # Paused until the sink has looked at them: the fetcher runs meanwhile, and records it returned before the
        # seek (or before a recreated partition's watermark is gone) would be judged against the wrong offsets.
        self.sink.consumer.pause(*assigned)
        try:
            await self.sink.seek_past_watermarks(assigned)
        finally:
            self.sink.consumer.resume(*assigned)


class ClickHouseSink:
    """Consumes the registry's topics into their tables; offsets are committed only after the insert."""

    def __init__(self, settings: SinkSettings):
        self.settings = settings
        names = settings.sink_tables or list(TABLES)
        unknown = set(names) - set(TABLES)
        if unknown:
            raise StoreError(f"sink_tables: unknown tables {sorted(unknown)}")
        self.tables: dict[str, Table] = {n: TABLES[n] for n in names}
        self.by_topic = {t.topic.full(settings.topic_prefix): t for t in self.tables.values()}
        intakes = INTAKES if settings.sink_json_intake else {}
        self.batches = {topic: Batch(t, topic, intake=intakes.get(t.name)) for topic, t in self.by_topic.items()}
        self.stats = SinkStats(tables={n: TableStats() for n in names})
        # Writes go through one thread on one client; analysts' queries through another thread on a client of their
        # own, so a long query never holds ingestion up: chdb runs the two side by side (measured: 3,000 inserts
        # beside 4,000 queries from two threads, no error, every row there).
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self.query_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse-query")
        self.client = None
        self.query_client = None
        s = settings
        self.query_limits = QueryLimits(s.query_max_rows, s.query_max_bytes, s.query_max_seconds,
                                        s.query_max_memory_mb << 20)
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.stored: dict[tuple[str, int], int] = {}  # highest offset already in ClickHouse, per partition
        # One batch is stored and committed (flush) while the next gathers. The rebalance listener runs in aiokafka's
        # own task, so it and the main loop may flush at once: `flushing` keeps settle-detach-store one step.
        self.pending: asyncio.Task | None = None
        self.flushing = asyncio.Lock()
        self.failed: Exception | None = None  # what storing a batch raised: the sink stops on it, whoever saw it first
        self.generation = 0  # partition revocations so far
        self.dlq_log = LogBudget()  # a flood of bad records is counted in full, logged 20 lines a minute

    async def db(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, lambda: fn(*args, **kwargs))

    async def open_store(self) -> None:
        self.client = await self.db(store.connect, self.settings)
        for stmt in await self.db(store.apply_schema, self.client, self.settings):
            log.warning("schema migration: %s", stmt)
        drift = await self.db(store.schema_drift, self.client, self.settings.clickhouse_database,
                              self.settings.clickhouse_cluster)
        if drift:
            raise StoreError("live tables differ from the schemas: " + "; ".join(drift)
                             + " (`fleetpulse migrate` rebuilds them in the current layout, with their rows)")
        await self.db(store.record_rack_budgets, self.client, self.settings.rack_budgets())

    async def start(self) -> None:
        if self.client is None:
            await self.open_store()
        kafka = self.settings.kafka_client_args()
        await ensure_topics(kafka, prefix=self.settings.topic_prefix, replication=self.settings.replication)
        # What is already stored, before any fetch: take() refuses to insert at or below it even when the rebalance
        # listener's seek did not happen (a listener that raises is only logged by aiokafka).
        self.stored = await self.db(store.watermarks, self.client)
        for topic, epoch in (await self.db(store.topic_epochs, self.client)).items():
            if topic in self.batches:
                self.batches[topic].epoch = epoch
        self.producer = AIOKafkaProducer(**kafka, acks="all", enable_idempotence=True)
        await self.producer.start()
        await self.store_inflight_again()
        self.consumer = AIOKafkaConsumer(
            **kafka,
            group_id=self.settings.topic_prefix + self.settings.sink_group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.settings.sink_fetch_max_records,
        )
        self.consumer.subscribe(list(self.by_topic), listener=_Rebalance(self))
        await self.consumer.start()
        self.stats.ready = True

    async def store_inflight_again(self) -> None:
        """Insert the last batch of each topic again, same records, same token (sinks/inflight.py): a no-op when it
        was stored whole, the missing parts when the sink stopped mid-insert."""
        for topic, (token, epoch, ranges) in (await self.db(store.last_inflight, self.client)).items():
            batch = self.batches.get(topic)
            if batch is None or epoch != batch.epoch:  # not fed here any more, or the topic was recreated since
                continue
            records = await inflight.read_ranges(self.settings.kafka_client_args(), topic, ranges)
            if records is None:
                log.warning("the last batch of %s (%s) can no longer be read whole; not stored again", topic, token)
                continue
            again = Batch(batch.table, topic, epoch=epoch, intake=batch.intake)
            for rec in records:
                try:
                    value = batch.table.topic.decode_keyed(rec.key, rec.value)
                    rows, count = self.unit(again, rec, value)
                    again.add(rec.partition, rec.offset, rows, rec.value, rec.key, count, rec.timestamp)
                except DecodeError:
                    continue  # dead-lettered when it was first read, before the insert
            again.ranges = {p: list(span) for p, span in ranges.items()}
            if again.rows and again.token() == token:
                await self.insert_batch(again, again=True)
                self.stats.tables[batch.table.name].stored_again += 1

    async def seek_past_watermarks(self, assigned) -> None:
        """Resume after the highest offset already stored, even where Kafka's commit lags behind it (the batch a sink
        stopped in is stored again at start, sinks/inflight.py), and commit that position: the rows are durable, and the
        group's lag would otherwise count them as unread until new records pass them. A partition that ends at or below
        that offset was recreated and is read as new (reset_recreated)."""
        marks = await self.db(store.watermarks, self.client)
        await self.reset_recreated(assigned, marks)
        self.stored = marks
        behind: dict[TopicPartition, int] = {}
        for tp in assigned:
            stored = marks.get((tp.topic, tp.partition))
            if stored is None:
                continue
            committed = await self.consumer.committed(tp)
            if committed is None or committed <= stored:
                self.consumer.seek(tp, stored + 1)
                behind[tp] = stored + 1
                log.info("resuming %s[%d] at %d after stored rows", tp.topic, tp.partition, stored + 1)
        if behind:
            try:
                await self.consumer.commit(behind)
            except KafkaError as exc:  # the store's watermark decides where to resume; the commit only shows it
                log.warning("could not commit the stored positions %s: %r", behind, exc)

    async def reset_recreated(self, assigned, marks: dict[tuple[str, int], int]) -> None:
        """A partition whose log ends at or below the highest offset stored from it is not the one those rows came
        from (a topic deleted and made again, a wiped broker, a store moved to another cluster): its offsets began
        again, and skipping them as replays would lose every record. Its watermark goes (the reset is recorded in
        sink_topic_resets, with a warning) and the topic's insert tokens take a new epoch. A recreated topic that has
        already grown past the old watermark cannot be told apart by offsets (README, "The sink")."""
        held = [tp for tp in assigned if (tp.topic, tp.partition) in marks]
        if not held:
            return
        ends = await self.consumer.end_offsets(held)
        for tp in held:
            stored, end = marks[(tp.topic, tp.partition)], ends.get(tp)
            if end is None or stored < end:
                continue
            await self.db(store.reset_watermark, self.client, tp.topic, tp.partition, stored, end,
                          store.layout(self.settings))
            del marks[(tp.topic, tp.partition)]
            batch = self.batches[tp.topic]
            batch.epoch += 1
            self.stats.tables[batch.table.name].topic_resets += 1
            log.warning("%s[%d] ends at offset %d but the store holds its rows up to offset %d: the topic was "
                        "recreated (or this store belongs to another cluster); its records are stored as new ones "
                        "(recorded in sink_topic_resets)", tp.topic, tp.partition, end, stored)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            while not stop.is_set():
                fetched = await self.consumer.getmany(timeout_ms=100, max_records=self.settings.sink_fetch_max_records)
                generation = self.generation
                for tp, records in fetched.items():
                    await self.take(tp, records, generation)
                for batch in self.batches.values():
                    if batch.due(self.settings.sink_batch_max_rows, self.settings.sink_batch_max_seconds):
                        await self.flush(batch)
                if self.failed is not None or (self.pending is not None and self.pending.done()):
                    await self.settle()  # what storing a batch raised, raised here
            await self.flush_all()
        finally:
            await self.close()

    async def take(self, tp: TopicPartition, records, generation: int) -> None:
        """Batch the records fetched (dead-lettering the ones refused), flushing a full batch. Stops when the partitions
        were revoked since they were fetched: the listener stored what was taken, and a record taken after that would
        be taken again from the partition's next owner (this sink too), and stored twice."""
        batch = self.batches[tp.topic]
        stats = self.stats.tables[batch.table.name]
        stored = self.stored.get((tp.topic, tp.partition), -1)
        for rec in records:
            if self.generation != generation:
                return
            if rec.offset <= stored:  # the seek above can race the fetcher; never insert a stored offset twice
                stats.already_stored += 1
                batch.cover(tp.partition, rec.offset)
                continue
            stats.records += 1
            try:
                value = batch.table.topic.decode_keyed(rec.key, rec.value)
                rows, count = self.unit(batch, rec, value)
            except DecodeError as exc:
                await self.send_dead_letter(tp.topic, tp.partition, rec.offset, rec.value, rec.key, str(exc))
                stats.dead_letters += 1
                if self.generation != generation:
                    return  # its offset is the next owner's to commit (it dead-letters it again: at least once)
                batch.cover(tp.partition, rec.offset)
                continue
            batch.add(tp.partition, rec.offset, rows, rec.value, rec.key, count, rec.timestamp)
            if batch.count >= self.settings.sink_batch_max_rows:
                await self.flush(batch)

    @staticmethod
    def unit(batch: Batch, rec, value: dict) -> tuple[list, int | None]:
        """What the batch holds for a checked record: its rows, or, where the engine extracts them, its line and how
        many rows that stores."""
        table, intake = batch.table, batch.intake
        if intake is None:
            return table.rows(value, rec.partition, rec.offset, rec.timestamp), None
        count = len(value[table.items])
        return ([intake.line(rec.value, rec.partition, rec.offset, rec.timestamp)] if count else []), count

    async def send_dead_letter(self, topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None,
                               reason: str) -> None:
        key, value, headers = dead_letter(value, key=key, reason=reason, topic=topic, partition=partition,
                                          offset=offset, component="sink")
        base = self.by_topic[topic].topic
        await self.producer.send_and_wait(base.dlq(self.settings.topic_prefix), value, key=key, headers=headers)
        show, held = self.dlq_log.take()
        if show:
            log.warning("dead-lettered %s[%d]@%d: %s%s", topic, partition, offset, reason, self.dlq_log.suffix(held))

    async def flush(self, batch: Batch) -> None:
        """Store the batch's records and then commit their offsets, while the next ones are read: the insert runs on
        the store's thread (the engine parses and writes there), one at a time. A second flush first waits for the
        first to be stored and committed (settle), so offsets are committed in order, each after its rows."""
        async with self.flushing:
            await self._settle()
            if not batch.empty:
                self.pending = asyncio.create_task(self.store_batch(batch.detach()))

    async def settle(self) -> None:
        """Wait for the batch being stored to be stored and committed; raises what storing it (or an earlier batch)
        raised."""
        async with self.flushing:
            await self._settle()

    async def _settle(self) -> None:
        if self.pending is not None:
            try:
                await self.pending
            except Exception as exc:
                self.failed = self.failed or exc
            finally:
                self.pending = None
        if self.failed is not None:
            raise self.failed

    async def store_batch(self, batch: Batch) -> None:
        """Insert the batch (retrying what is retryable), then commit its offsets."""
        stats = self.stats.tables[batch.table.name]
        if batch.rows:
            await self.db(store.record_inflight, self.client, batch.topic, batch.token(), batch.epoch, batch.ranges)
            began = time.perf_counter()
            stats.rows += await self.insert_batch(batch)
            stats.last_insert_ms = round((time.perf_counter() - began) * 1000, 2)
            stats.batches += 1
        await self.consumer.commit({TopicPartition(batch.topic, p): o for p, o in batch.next_offsets().items()})

    async def insert_batch(self, batch: Batch, again: bool = False) -> int:
        """Insert the batch; the rows stored. When the store refuses rows of it (a value a column cannot hold, a
        constraint, too many partitions at once), the records behind them are found by halving and dead-lettered and
        the rest stored, so one poison pill never stops the topic. A batch stored `again` at start-up was dead-lettered
        from when it was first inserted: its refused records are not sent twice."""
        try:
            await self.insert_with_retry(batch, batch.rows, batch.token())
            return batch.count
        except StoreError as exc:
            if not exc.bad_rows:
                raise
            if batch.intake is not None and await self.stored_as_rows(batch, batch.entries, batch.token(), exc):
                return batch.count
            log.warning("%s refused rows of a batch of %d records (%s); finding the records at fault",
                        batch.table.name, len(batch.entries), exc)
            self.stats.tables[batch.table.name].split_batches += 1
            batch.canonical_order()
            refused = await self.isolate(batch, batch.entries, exc, dead_letter=not again)
            if len(refused) == len(batch.entries) > 1:
                log.error("%s refused every one of %d records (%s): the table itself may be at fault; they are in %s",
                          batch.table.name, len(refused), exc, batch.table.topic.dlq(self.settings.topic_prefix))
        return batch.count - sum(e.count for e in refused)

    async def isolate(self, batch: Batch, entries: list[Entry], exc: StoreError,
                      dead_letter: bool = True) -> list[Entry]:
        """`entries` (whose insert failed with `exc`) halved until each failing record stands alone: its dead letter
        goes out, the halves that insert are stored. In order, so what is stored of a partition is always a prefix of
        the batch's records (the resume watermark, the highest stored offset, stays true across a crash)."""
        if len(entries) == 1:
            e = entries[0]
            if batch.intake is not None and await self.stored_as_rows(batch, entries, batch.segment_token(entries),
                                                                      exc):
                return []
            if dead_letter:
                await self.send_dead_letter(batch.topic, e.partition, e.offset, e.value, e.key,
                                            f"the store refused it: {exc}")
                self.stats.tables[batch.table.name].dead_letters += 1
            return [e]
        refused: list[Entry] = []
        mid = len(entries) // 2
        for half in (entries[:mid], entries[mid:]):
            try:
                await self.insert_with_retry(batch, batch.rows[half[0].start:half[-1].end], batch.segment_token(half))
            except StoreError as sub:
                if not sub.bad_rows:
                    raise
                refused += await self.isolate(batch, half, sub, dead_letter)
        return refused

    async def stored_as_rows(self, batch: Batch, entries: list[Entry], token: str, exc: StoreError) -> bool:
        """Records the checks passed and the engine's extraction refused (`exc`), stored the way of the other tables:
        their rows from Python, under a token of their own (the same on a replay). The whole batch is tried this way
        first (a JSON form the validator reads and ClickHouse's parser does not, such as a key given twice, costs one
        more insert), then each record that still stands alone in `isolate`. False when the store refuses those rows
        too (a constraint, a value out of a column's range): the records at fault are found by halving."""
        table = batch.table
        rows = [row for e in entries
                for row in table.rows(table.topic.decode_keyed(e.key, e.value), e.partition, e.offset, e.kafka_ts)]
        try:
            await self.insert_with_retry(batch, rows, token + "|rows", as_rows=True)
        except StoreError as refused:
            if not refused.bad_rows:
                raise
            return False
        show, held = self.dlq_log.take()
        if show:
            first = entries[0]
            log.warning("%s[%d]@%d (%d records): stored from Python rows, the engine refused their JSON: %s%s",
                        batch.topic, first.partition, first.offset, len(entries), exc, self.dlq_log.suffix(held))
        return True

    async def insert_with_retry(self, batch: Batch, rows: list, token: str, as_rows: bool = False) -> None:
        s = self.settings
        if batch.intake is None or as_rows:
            call = (store.insert, self.client, batch.table.name, batch.table.column_names, rows, token,
                    s.sink_max_partitions_per_insert)
        else:
            call = (store.insert_lines, self.client, batch.table.name, batch.intake, rows, token,
                    s.sink_max_partitions_per_insert, s.embedded_store)
        for attempt in range(self.settings.sink_insert_retries + 1):
            try:
                await self.db(*call)
                return
            except StoreError as exc:
                if not exc.retryable or attempt == self.settings.sink_insert_retries:
                    raise
                delay = min(0.2 * 2**attempt, 10.0)
                log.warning("retryable insert failure (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)  # consumption stops at the next full batch: the sink pauses, never drops

    async def flush_all(self) -> None:
        """Every batch stored and committed before this returns (a revoked partition, a stop)."""
        for batch in self.batches.values():
            await self.flush(batch)
        await self.settle()

    async def query(self, sql: str) -> bytes:
        """An analyst's read-only statement on the sink's own store (the one process allowed to open an embedded
        store), within the settings' limits, on the query thread: inserts go on meanwhile."""
        def run() -> bytes:
            if self.query_client is None:
                self.query_client = store.connect(self.settings)
            return store.run_guarded(self.query_client, sql, self.query_limits)

        return await asyncio.get_running_loop().run_in_executor(self.query_thread, run)

    async def close(self) -> None:
        self.stats.ready = False
        try:  # stopping on an error: the batch being stored finishes (or fails) before the consumer goes
            await self.settle()
        except Exception as exc:  # the error that stopped the sink is the one raised
            log.warning("stopping with a batch not stored (%s): its records are read again at the next start", exc)
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
