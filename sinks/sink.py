"""The sink loop: consume, check and batch per table, store each batch while the next gathers, then commit.

The parts: sinks/batch.py (what a batch holds), sinks/inserts.py (storing one batch, refused rows set aside),
sinks/outage.py (waiting out a store that is away: every write goes through it), sinks/watermarks.py (where a
partition resumes), sinks/inflight.py (the batch a stopped sink was inserting, stored again), sinks/dead_letters.py,
sinks/status.py (/status and /metrics). A store that stops taking writes holds the batch being stored; the batches
behind it fill, and once one is full the sink pauses consuming (still polling, so the group keeps it) until the store
takes writes again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from core.clickhouse import QueryLimits, connect
from core.errors import DecodeError, StoreError
from schemas.json_intake import INTAKES
from schemas.provision import ensure_topics
from schemas.tables import TABLES, Table
from sinks import inflight, store
from sinks.batch import Batch
from sinks.dead_letters import DeadLetters
from sinks.heap import HeapTrim
from sinks.inserts import Inserter
from sinks.outage import Outages
from sinks.settings import SinkSettings
from sinks.status import SinkStats, TableStats
from sinks.watermarks import Rebalance

log = logging.getLogger("fleetpulse.sink")
HOLD_S = 1.0  # how long a due batch waits for the one being stored before the loop polls again
STOP_GRACE_S = 20.0  # how long a stopping sink gives the store to take its last batches


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
        # the streams every host sends every interval may wait longer to fill a batch than the sparse events: at 5,000
        # hosts, a batch of each a second made the ClickHouse server spend 0.73 cores, one every 5 s 0.49
        # (docs/scale.md: on two cores shared with the stream worker, 5 s made the stages' lag worse)
        self.batch_wait_s = {topic: settings.sink_periodic_batch_max_seconds if t.topic.periodic
                             else settings.sink_batch_max_seconds for topic, t in self.by_topic.items()}
        self.outages = Outages(wait_max_s=settings.sink_wait_max_s)
        self.stats = SinkStats(tables={n: TableStats() for n in names}, outages=self.outages, held=self.held)
        # Writes go through one thread on one client; analysts' queries (embedded store) through another thread on a
        # client of their own, so a long query never holds ingestion up: chdb runs the two side by side (measured:
        # 3,000 inserts beside 4,000 queries from two threads, no error, every row there).
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self.query_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse-query")
        self.client = None
        self.query_client = None
        self.query_limits = QueryLimits.of(settings)
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.dead_letters: DeadLetters | None = None
        self.inserter = Inserter(settings, self.on_store, self.outages, None, self.stats.tables)
        self.stored: dict[tuple[str, int], int] = {}  # highest offset already in ClickHouse, per partition
        # One batch is stored and committed (flush) while the next gathers. The rebalance listener runs in aiokafka's
        # own task, so it and the main loop may flush at once: `flushing` keeps settle-detach-store one step.
        self.pending: asyncio.Task | None = None
        self.flushing = asyncio.Lock()
        self.failed: Exception | None = None  # what storing a batch raised: the sink stops on it, whoever saw it first
        self.generation = 0  # partition revocations so far
        self.paused: set[TopicPartition] = set()  # paused by the sink behind a full batch
        self.heap = HeapTrim()  # a catch-up's freed batches go back to the system (sinks/heap.py)

    async def on_store(self, fn, *args, **kwargs):
        """`fn(*args)` on the store's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, lambda: fn(*args, **kwargs))

    async def on_store_waiting(self, what: str, fn, *args):
        """`fn(writer's client, *args)` on the store's thread, waited out while the store is away."""
        return await self.outages.call(what, lambda: self.on_store(fn, self.client, *args))

    async def open_store(self) -> None:
        """The tables made or migrated by the schema owner (unless sink_apply_schema is off), then the writer's
        client; waits while the store does not answer, stops on what waiting cannot mend."""
        s = self.settings
        if s.sink_apply_schema:
            for stmt in await self.outages.call("applying the schema", lambda: self.on_store(store.prepare, s)):
                log.warning("schema migration: %s", stmt)
        self.client = await self.outages.call("connecting as the writer", lambda: self.on_store(connect, s, "writer"))
        self.inserter.client = self.client
        drift = await self.on_store_waiting("checking the tables", store.schema_drift, s.clickhouse_database,
                                            s.clickhouse_cluster)
        if drift:
            fix = ("`fleetpulse migrate` rebuilds them in the current layout, with their rows" if s.sink_apply_schema
                   else "the schema owner applies the DDL with `fleetpulse migrate`")
            raise StoreError("live tables differ from the schemas: " + "; ".join(drift) + f" ({fix})")
        await self.on_store_waiting("recording the rack budgets", store.record_rack_budgets, s.rack_budgets())

    async def start(self) -> None:
        if self.client is None:
            await self.open_store()
        kafka = self.settings.kafka_client_args()
        await ensure_topics(kafka, prefix=self.settings.topic_prefix, replication=self.settings.replication)
        # What is already stored, before any fetch: take() refuses to insert at or below it even when the rebalance
        # listener's seek did not happen (a listener that raises is only logged by aiokafka).
        self.stored = await self.on_store_waiting("reading the watermarks", store.watermarks)
        for topic, epoch in (await self.on_store_waiting("reading the topic resets", store.topic_epochs)).items():
            if topic in self.batches:
                self.batches[topic].epoch = epoch
        self.producer = AIOKafkaProducer(**kafka, acks="all", enable_idempotence=True)
        await self.producer.start()
        self.dead_letters = self.inserter.dead_letters = DeadLetters(self.producer, self.outages,
                                                                     self.settings.topic_prefix)
        await self.store_inflight_again()
        self.consumer = AIOKafkaConsumer(
            **kafka,
            group_id=self.settings.topic_prefix + self.settings.sink_group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.settings.sink_fetch_max_records,
        )
        self.consumer.subscribe(list(self.by_topic), listener=Rebalance(self))
        await self.consumer.start()
        self.stats.ready = True

    async def store_inflight_again(self) -> None:
        """Insert the last batch of each topic again, same records, same token (sinks/inflight.py): a no-op when it
        was stored whole, the missing parts when the sink stopped mid-insert."""
        for topic, (token, epoch, ranges) in (await self.on_store_waiting("reading the batches in flight",
                                                                          store.last_inflight)).items():
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
                await self.inserter.store(again, again=True)
                self.stats.tables[batch.table.name].stored_again += 1

    async def run(self, stop: asyncio.Event) -> None:
        if not await self.started(stop):
            return
        try:
            while not stop.is_set():
                fetched = await self.consumer.getmany(timeout_ms=100, max_records=self.settings.sink_fetch_max_records)
                generation = self.generation
                for tp, records in fetched.items():
                    await self.take(tp, records, generation)
                for topic, batch in self.batches.items():
                    if batch.due(self.settings.sink_batch_max_rows, self.batch_wait_s[topic]):
                        await self.flush(batch)
                if self.failed is not None or (self.pending is not None and self.pending.done()):
                    await self.settle()  # what storing a batch raised, raised here
                self.pace()
                self.heap.tick()
            await self.finish()
        finally:
            await self.close()

    async def started(self, stop: asyncio.Event) -> bool:
        """Start, unless `stop` comes first (the store away at start-up is waited for until then): False, with
        everything closed, when it did."""
        starting, stopped = asyncio.create_task(self.start()), asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            starting.cancel()
            raise
        finally:
            stopped.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            log.warning("stopped before the sink started%s", f" (waiting for the store: {self.outages.current.name})"
                        if self.outages.waiting else "")
            await self.close()
            return False
        try:
            starting.result()
        except BaseException:
            await self.close()
            raise
        return True

    def held(self) -> dict[str, int]:
        """Per table, the rows read and not yet stored (the batch gathering; the one being stored is not counted)."""
        out: dict[str, int] = {}
        for b in self.batches.values():
            out[b.table.name] = out.get(b.table.name, 0) + b.count
        return out

    def pace(self) -> None:
        """Pause consuming while a batch is full and cannot be stored yet (the store is busy with the last one, or
        away); resume once none is. The loop still polls meanwhile, so the group keeps this member."""
        full = any(b.count >= self.settings.sink_batch_max_rows for b in self.batches.values())
        if full:
            self.paused = set(self.consumer.assignment())  # again each time: a rebalance resumes what it assigns
            self.consumer.pause(*self.paused)
        elif self.paused:
            self.consumer.resume(*(self.paused & set(self.consumer.assignment())))
            self.paused = set()
        self.stats.paused = bool(self.paused)

    async def finish(self) -> None:
        """On a stop: every batch stored and committed, unless the store is away or does not take them within
        STOP_GRACE_S. What is not stored then is not committed either, and is read again at the next start."""
        if self.outages.waiting:
            return
        try:
            await asyncio.wait_for(self.flush_all(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            log.warning("the store did not take the last batches within %g s of the stop: they are read again at the "
                        "next start", STOP_GRACE_S)

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
                await self.dead_letters.send(batch.table.topic, tp.topic, tp.partition, rec.offset, rec.value,
                                             rec.key, str(exc))
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

    async def flush(self, batch: Batch, hold_s: float | None = HOLD_S) -> None:
        """Store the batch's records and then commit their offsets, while the next ones are read: the insert runs on
        the store's thread (the engine parses and writes there), one at a time, so offsets are committed in order, each
        after its rows. While the last batch is still being stored after `hold_s` (None: as long as it takes), this one
        stays and gathers on; the loop comes back to it."""
        async with self.flushing:
            if self.pending is not None and not self.pending.done() and hold_s is not None:
                await asyncio.wait({self.pending}, timeout=hold_s)
                if not self.pending.done():
                    return
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
        """Record the batch as in flight, insert it, then commit its offsets; each step waited out while the store
        (or the broker) is away."""
        stats = self.stats.tables[batch.table.name]
        began = time.perf_counter()
        if batch.rows:
            await self.on_store_waiting(f"recording the batch of {batch.table.name} in flight", store.record_inflight,
                                        batch.topic, batch.token(), batch.epoch, batch.ranges)
            stats.rows += await self.inserter.store(batch)
            stats.last_insert_ms = round((time.perf_counter() - began) * 1000, 2)
            stats.batches += 1
        offsets = {TopicPartition(batch.topic, p): o for p, o in batch.next_offsets().items()}
        try:
            await self.outages.call(f"committing {batch.topic}", lambda: self.consumer.commit(offsets))
        except (CommitFailedError, IllegalStateError) as exc:
            # The group rebalanced while the batch was stored: this member was away longer than its session
            # (stopped, paused, starved of CPU) and its partitions may be another's now. The rows are stored; whoever
            # reads the partitions next resumes after them (sinks/watermarks.py) and commits that.
            stats.commits_lost += 1
            log.warning("the batch of %s is stored but its offsets were not committed (%s): the group rebalanced "
                        "meanwhile; the partitions' next reader resumes after the stored rows", batch.table.name,
                        type(exc).__name__)
        stats.stored(time.perf_counter() - began, max((e.kafka_ts for e in batch.entries), default=0))

    async def flush_all(self) -> None:
        """Every batch stored and committed before this returns (a revoked partition, a stop)."""
        for batch in self.batches.values():
            await self.flush(batch, hold_s=None)
        await self.settle()

    async def query(self, sql: str) -> bytes:
        """An analyst's read-only statement on the sink's own store (the one process allowed to open an embedded
        store), within the settings' limits, on the query thread: inserts go on meanwhile."""
        def run() -> bytes:
            if self.query_client is None:
                self.query_client = connect(self.settings, "analyst")
            return store.run_guarded(self.query_client, sql, self.query_limits)

        return await asyncio.get_running_loop().run_in_executor(self.query_thread, run)

    async def close(self) -> None:
        self.stats.ready = False
        if self.outages.waiting and self.pending is not None and not self.pending.done():
            # Stopping while the store is away: what is not stored is not committed, and is read again at the next
            # start (the batch in flight, if it was recorded, is stored again under its token: sinks/inflight.py).
            log.warning("stopping while the store is away (%s): the batch not stored is read again at the next start",
                        self.outages.current.name)
            self.pending.cancel()
        try:  # stopping on an error: the batch being stored finishes (or fails) before the consumer goes
            await self.settle()
        except (Exception, asyncio.CancelledError) as exc:  # the error that stopped the sink is the one raised
            log.warning("stopping with a batch not stored (%r): its records are read again at the next start", exc)
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
