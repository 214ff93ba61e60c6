"""Storing one batch: one insert under its deduplication token, waited out while the store is away (sinks/outage.py);
when the store refuses rows of it, the records at fault found by halving, dead-lettered, and the rest stored."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

from core.errors import StoreError
from sinks import store
from sinks.batch import Batch, Entry
from sinks.dead_letters import DeadLetters
from sinks.outage import Outages
from sinks.settings import SinkSettings
from sinks.status import TableStats

log = logging.getLogger("fleetpulse.sink")
OnStore = Callable[..., Awaitable]  # runs a store function on the sink's store thread: (fn, *args) -> its result


class Inserter:
    def __init__(self, settings: SinkSettings, on_store: OnStore, outages: Outages, dead_letters: DeadLetters,
                 stats: dict[str, TableStats]):
        self.settings, self.on_store, self.outages = settings, on_store, outages
        self.dead_letters, self.stats = dead_letters, stats
        self.client = None  # the writer's client, set once the store is open

    async def store(self, batch: Batch, again: bool = False) -> int:
        """Insert the batch; the rows stored. When the store refuses rows of it (a value a column cannot hold, a
        constraint, too many partitions at once), the records behind them are found by halving and dead-lettered and
        the rest stored, so one poison pill never stops the topic. A batch stored `again` at start-up was dead-lettered
        from when it was first inserted: its refused records are not sent twice."""
        try:
            await self.insert(batch, batch.rows, batch.token())
            return batch.count
        except StoreError as exc:
            if not exc.bad_rows:
                raise
            if batch.intake is not None and await self.stored_as_rows(batch, batch.entries, batch.token(), exc):
                return batch.count
            log.warning("%s refused rows of a batch of %d records (%s); finding the records at fault",
                        batch.table.name, len(batch.entries), exc)
            self.stats[batch.table.name].split_batches += 1
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
                await self.dead_letters.send(batch.table.topic, batch.topic, e.partition, e.offset, e.value, e.key,
                                             f"the store refused it: {exc}")
                self.stats[batch.table.name].dead_letters += 1
            return [e]
        refused: list[Entry] = []
        mid = len(entries) // 2
        for half in (entries[:mid], entries[mid:]):
            try:
                await self.insert(batch, batch.rows[half[0].start:half[-1].end], batch.segment_token(half))
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
            await self.insert(batch, rows, token + "|rows", as_rows=True)
        except StoreError as refused:
            if not refused.bad_rows:
                raise
            return False
        first = entries[0]
        self.dead_letters.log(f"{batch.topic}[{first.partition}]@{first.offset} ({len(entries)} records): stored "
                              f"from Python rows, the engine refused their JSON: {exc}")
        return True

    async def insert(self, batch: Batch, rows: list, token: str, as_rows: bool = False) -> None:
        """One insert, tried again while the store is away, busy or out of parts (the same token: a retry that the
        store had in fact stored is a no-op); what waiting cannot mend is raised."""
        s, table = self.settings, batch.table
        if batch.intake is None or as_rows:
            call = partial(store.insert, self.client, table.name, table.column_names, rows, token,
                           s.sink_max_partitions_per_insert)
        else:
            call = partial(store.insert_lines, self.client, table.name, batch.intake, rows, token,
                           embedded=s.embedded_store, max_partitions=s.sink_max_partitions_per_insert)
        await self.outages.call(f"insert into {table.name}", lambda: self.on_store(call))
