"""What the sink has done, per table, and whether it is waiting on its store: /status as JSON, /metrics as
Prometheus text (the names every role uses for the same things: received, emitted, refused, errors, batch latency)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    insert_seconds: float = 0.0  # summed over the batches stored (outages included)


@dataclass
class SinkStats:
    tables: dict[str, TableStats] = field(default_factory=dict)
    outages: Outages = field(default_factory=Outages)
    started_at: float = field(default_factory=time.time)
    ready: bool = False
    paused: bool = False  # consuming paused: a full batch waits for the store

    def as_dict(self) -> dict:
        return {
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "store": {**self.outages.state(), "consuming_paused": self.paused},
            "tables": {name: vars(s) for name, s in self.tables.items()},
        }


class SinkMetrics(Collector):
    """Reads the sink's counters at scrape time."""

    def __init__(self, stats: SinkStats):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        counters = {"received": ("records", "records taken from the table's topic"),
                    "emitted": ("rows", "rows stored in the table"),
                    "refused": ("dead_letters", "records dead-lettered: the validator or the store refused them"),
                    "replayed": ("already_stored", "records read again at or below the stored watermark, skipped"),
                    "batches": ("batches", "inserts stored"),
                    "batch_seconds": ("insert_seconds", "time spent storing batches, waits for the store included")}
        for name, (attr, help_text) in counters.items():
            family = CounterMetricFamily(f"fleetpulse_sink_{name}", help_text, labels=["table"])
            for table, s in sorted(self.stats.tables.items()):
                family.add_metric([table], getattr(s, attr))
            yield family
        outages = self.stats.outages
        yield GaugeMetricFamily("fleetpulse_sink_store_waiting", "1 while the store does not take the sink's writes "
                                "and the sink waits for it", value=int(outages.waiting))
        yield GaugeMetricFamily("fleetpulse_sink_consuming_paused", "1 while consuming is paused behind a full batch",
                                value=int(self.stats.paused))
        yield CounterMetricFamily("fleetpulse_sink_store_outages", "times the store stopped taking writes",
                                  value=outages.count)
        yield CounterMetricFamily("fleetpulse_sink_store_wait_seconds", "time spent waiting for the store",
                                  value=outages.total_waited_s())
        errors = CounterMetricFamily("fleetpulse_sink_errors", "store (or broker) calls that failed and were tried "
                                     "again, by error", labels=["error"])
        for name, n in sorted(outages.by_error.items()):
            errors.add_metric([name], n)
        yield errors


def exposition(stats: SinkStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SinkMetrics(stats))
    ProcessCollector(registry=registry)
    return generate_latest(registry)
