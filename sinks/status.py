"""What the sink has done, per table, and whether it is waiting on its store: /status as JSON, /metrics as
Prometheus text under the words every role shares (core/metrics.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from core.metrics import EventLag, Latency, MetricSpec, own, shared
from sinks.outage import Outages


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
    commits_lost: int = 0  # batches stored whose offsets the group refused (it rebalanced meanwhile): read past later
    latency: Latency = field(default_factory=Latency)  # per batch stored and committed (outages included)
    lag: EventLag = field(default_factory=EventLag)  # of the latest batch stored and committed

    def stored(self, seconds: float, newest_ts_ms: int, now: float | None = None) -> None:
        self.latency.observe(seconds)
        self.lag.observe(newest_ts_ms, now)

    def as_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k not in ("latency", "lag")}
        return {**out, "insert_seconds": round(self.latency.sum_s, 3), "newest_ts_ms": self.lag.newest_ts_ms,
                "lag_s": round(self.lag.lag_s, 3)}


@dataclass
class SinkStats:
    tables: dict[str, TableStats] = field(default_factory=dict)
    outages: Outages = field(default_factory=Outages)
    started_at: float = field(default_factory=time.time)
    ready: bool = False
    paused: bool = False  # consuming paused: a full batch waits for the store
    held: Callable[[], Mapping[str, int]] | None = None  # table -> rows read and not yet stored (set by the sink)

    def as_dict(self) -> dict:
        return {
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "store": {**self.outages.state(), "consuming_paused": self.paused},
            "tables": {name: s.as_dict() for name, s in self.tables.items()},
        }


RECEIVED = shared("sink", "received", "records taken from the table's topic", ["table"])
EMITTED = shared("sink", "emitted", "rows stored in the table", ["table"])
REFUSED = shared("sink", "refused", "records dead-lettered: the validator or the store refused them", ["table"])
ERRORS = shared("sink", "errors", "store (or broker) calls that failed and were tried again, by error", ["error"])
BATCH = shared("sink", "batch_seconds", "a batch recorded in flight, inserted and committed, waits for the store "
               "included", ["table"])
LAG = shared("sink", "lag_seconds", "when the table's latest batch was committed, minus the Kafka timestamp of its "
             "newest record", ["table"])
STATE = shared("sink", "state_entries", "rows read and not yet stored", ["table"])
REPLAYED = own("sink", "replayed", "counter", "records read again at or below the stored watermark, skipped",
               ["table"])
WAITING = own("sink", "store_waiting", "gauge", "1 while the store does not take the sink's writes and the sink "
              "waits for it")
PAUSED = own("sink", "consuming_paused", "gauge", "1 while consuming is paused behind a full batch")
OUTAGES = own("sink", "store_outages", "counter", "times the store stopped taking writes")
WAITED = own("sink", "store_wait_seconds", "counter", "time spent waiting for the store")
CATALOGUE: tuple[MetricSpec, ...] = (RECEIVED, EMITTED, REFUSED, ERRORS, BATCH, LAG, STATE, REPLAYED, WAITING,
                                     PAUSED, OUTAGES, WAITED)


class SinkMetrics(Collector):
    """Reads the sink's counters at scrape time."""

    def __init__(self, stats: SinkStats):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        tables = sorted(self.stats.tables.items())
        yield RECEIVED.of(([t], s.records) for t, s in tables)
        yield EMITTED.of(([t], s.rows) for t, s in tables)
        yield REFUSED.of(([t], s.dead_letters) for t, s in tables)
        yield REPLAYED.of(([t], s.already_stored) for t, s in tables)
        yield BATCH.of(([t], s.latency) for t, s in tables)
        yield LAG.of(([t], s.lag.lag_s) for t, s in tables if s.lag.newest_ts_ms)
        if self.stats.held is not None:
            yield STATE.of(([t], n) for t, n in sorted(self.stats.held().items()))
        outages = self.stats.outages
        yield WAITING.family(int(outages.waiting))
        yield PAUSED.family(int(self.stats.paused))
        yield OUTAGES.family(outages.count)
        yield WAITED.family(outages.total_waited_s())
        yield ERRORS.of(([name], n) for name, n in sorted(outages.by_error.items()))


def exposition(stats: SinkStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SinkMetrics(stats))
    ProcessCollector(registry=registry)
    return generate_latest(registry)
