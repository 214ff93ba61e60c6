"""Per-table row batches that remember which Kafka offsets they cover."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from schemas.tables import Table


@dataclass
class Batch:
    """Rows for one table from one topic, plus the offset range per partition they came from."""

    table: Table
    topic: str  # the topic's name on the cluster (prefix included)
    rows: list[tuple] = field(default_factory=list)
    ranges: dict[int, list[int]] = field(default_factory=dict)
    opened: float | None = None

    def cover(self, partition: int, offset: int) -> None:
        """Account for an offset (with or without rows: dead-lettered records must be committed too)."""
        span = self.ranges.get(partition)
        if span is None:
            self.ranges[partition] = [offset, offset]
        else:
            span[1] = offset
        if self.opened is None:
            self.opened = time.monotonic()

    def add(self, partition: int, offset: int, rows: list[tuple]) -> None:
        self.rows.extend(rows)
        self.cover(partition, offset)

    def due(self, max_rows: int, max_age_s: float) -> bool:
        if self.opened is None:
            return False
        return len(self.rows) >= max_rows or time.monotonic() - self.opened >= max_age_s

    @property
    def empty(self) -> bool:
        return self.opened is None

    def token(self) -> str:
        """Deduplication token: topic plus the exact offset range of every partition in the batch."""
        spans = ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(self.ranges.items()))
        return f"{self.topic}|{spans}"

    def next_offsets(self) -> dict[int, int]:
        """What to commit once the batch is durable: the offset after the last one covered."""
        return {p: b + 1 for p, (_, b) in self.ranges.items()}

    def reset(self) -> None:
        self.rows = []
        self.ranges = {}
        self.opened = None
