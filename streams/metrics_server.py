"""The stream worker's counters as Prometheus text on a port, the way the agent serves its own."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from streams.metrics import LATENCY_BUCKETS_S, MetricsRegistry

log = logging.getLogger("fleetpulse.streams")
Lag = Callable[[], Mapping[str, int]]  # stage -> records on its inputs not yet processed


class WorkerMetrics(Collector):
    """Reads the stages' counters at scrape time; `lag` (optional) reports each stage's unprocessed input records."""

    def __init__(self, metrics: MetricsRegistry, lag: Lag | None = None):
        self.metrics, self.lag = metrics, lag

    def collect(self) -> Iterator[Metric]:
        helps = {"received": "records taken from the stage's inputs", "emitted": "records sent to its output topics",
                 "errored": "records it dead-lettered (internal records, or its rules raised)"}
        for name, help_text in helps.items():
            family = CounterMetricFamily(f"fleetpulse_stage_{name}", help_text, labels=["stage"])
            for stage, m in list(self.metrics.items()):
                family.add_metric([stage], getattr(m, name))
            yield family
        latency = HistogramMetricFamily("fleetpulse_stage_batch_seconds", "from taking a batch to its outputs and "
                                        "state being acknowledged", labels=["stage"])
        for stage, m in list(self.metrics.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, LATENCY_BUCKETS_S), "+Inf"), m.latency_counts):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([stage], buckets, m.latency_sum_s)
        yield latency
        refused = CounterMetricFamily("fleetpulse_topic_refused", "records the topic's validator refused, once per "
                                      "record in this worker (the sink dead-letters them)", labels=["topic"])
        for topic, n in sorted(self.metrics.refused.items()):
            refused.add_metric([topic], n)
        yield refused
        if self.lag is not None:
            lag = GaugeMetricFamily("fleetpulse_stage_lag_records", "records on the stage's input partitions that "
                                    "this worker holds and has not processed yet", labels=["stage"])
            for stage, n in sorted(self.lag().items()):
                lag.add_metric([stage], n)
            yield lag


def registry_for(metrics: MetricsRegistry, lag: Lag | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerMetrics(metrics, lag))
    ProcessCollector(registry=registry)
    return registry


def exposition(metrics: MetricsRegistry, lag: Lag | None = None) -> str:
    return generate_latest(registry_for(metrics, lag)).decode()


def serve(metrics: MetricsRegistry, port: int, addr: str = "0.0.0.0", lag: Lag | None = None):
    """Serve /metrics from a daemon thread; returns the server (its `server_port` is the bound port)."""
    server, _thread = start_http_server(port, addr, registry=registry_for(metrics, lag))
    log.info("worker metrics on http://%s:%d/metrics", addr, server.server_port)
    return server
