"""Per-table row batches that remember which Kafka offsets they cover, and which record each row came from.

What a batch holds for a record is what its insert sends: the record's rows as tuples (Table.rows), or, for a table
whose rows the engine extracts (schemas/json_intake.py), the record as one JSON line that becomes `count` rows."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from schemas.json_intake import JsonIntake
from schemas.tables import Table


class Entry(NamedTuple):
    """One record's rows in the batch: where it came from and its bytes, should the store refuse it."""

    partition: int
    offset: int
    start: int  # what it sends is batch.rows[start:end]
    end: int
    value: bytes | None
    key: bytes | None
    count: int  # the rows it stores
    kafka_ts: int  # its Kafka timestamp (ms)


@dataclass
class Batch:
    """Rows for one table from one topic, plus the offset range per partition they came from."""

    table: Table
    topic: str  # the topic's name on the cluster (prefix included)
    rows: list = field(default_factory=list)  # tuples, or JSON lines (bytes) when `intake` extracts the rows
    ranges: dict[int, list[int]] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)  # records with rows, in the order they came
    opened: float | None = None
    epoch: int = 0  # times one of the topic's partitions was found recreated: its offsets begin again
    intake: JsonIntake | None = None  # the engine extracts the rows from each record's line
    count: int = 0  # rows the batch stores

    def cover(self, partition: int, offset: int) -> None:
        """Account for an offset (with or without rows: dead-lettered records must be committed too)."""
        span = self.ranges.get(partition)
        if span is None:
            self.ranges[partition] = [offset, offset]
        else:
            span[1] = offset
        if self.opened is None:
            self.opened = time.monotonic()

    def add(self, partition: int, offset: int, rows: list, value: bytes | None = None,
            key: bytes | None = None, count: int | None = None, kafka_ts: int = 0) -> None:
        """A record's rows (or its line, which stores `count` rows); a record with none is only covered."""
        count = len(rows) if count is None else count
        if rows and count:
            self.entries.append(Entry(partition, offset, len(self.rows), len(self.rows) + len(rows), value, key, count,
                                      kafka_ts))
            self.rows.extend(rows)
            self.count += count
        self.cover(partition, offset)

    def due(self, max_rows: int, max_age_s: float) -> bool:
        if self.opened is None:
            return False
        return self.count >= max_rows or time.monotonic() - self.opened >= max_age_s

    @property
    def empty(self) -> bool:
        return self.opened is None

    def canonical_order(self) -> None:
        """Records (and their rows) in partition and offset order, not the order they were fetched in: a batch split
        around refused records then splits the same way whenever the same records are split again, a batch stored
        again after a stop included, so its parts keep their tokens (segment_token)."""
        rows, entries = [], []
        for e in sorted(self.entries, key=lambda e: (e.partition, e.offset)):
            entries.append(e._replace(start=len(rows), end=len(rows) + e.end - e.start))
            rows.extend(self.rows[e.start:e.end])
        self.rows, self.entries = rows, entries

    def token(self) -> str:
        """Deduplication token: topic (and its epoch once recreated: the same offsets are other records then) plus the
        exact offset range of every partition in the batch."""
        return self._token(self.ranges)

    def segment_token(self, entries: list[Entry]) -> str:
        """The token of an insert of some of the batch's records (the store refused the whole batch): distinct from
        the whole batch's, and the same for the same records whenever the batch is split again."""
        spans: dict[int, list[int]] = {}
        for e in entries:
            span = spans.setdefault(e.partition, [e.offset, e.offset])
            span[0], span[1] = min(span[0], e.offset), max(span[1], e.offset)
        return self._token(spans) + f"|{len(entries)} records"

    def _token(self, ranges: dict[int, list[int]]) -> str:
        spans = ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(ranges.items()))
        return f"{self.topic}#{self.epoch}|{spans}" if self.epoch else f"{self.topic}|{spans}"

    def next_offsets(self) -> dict[int, int]:
        """What to commit once the batch is durable: the offset after the last one covered."""
        return {p: b + 1 for p, (_, b) in self.ranges.items()}

    def detach(self) -> Batch:
        """The batch's records as a batch of their own (to be stored while the next ones gather); this one is emptied
        to take those."""
        taken = replace(self)
        self.reset()
        return taken

    def reset(self) -> None:
        self.rows = []
        self.count = 0
        self.ranges = {}
        self.entries = []
        self.opened = None
