"""The stream worker's counters as Prometheus text on a port, the way the agent serves its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
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
        crashes = CounterMetricFamily("fleetpulse_stage_crashes", "times the stage's lane loop raised and was "
                                      "restarted (/healthz fails for a minute after each)", labels=["stage"])
        for stage, m in list(self.metrics.items()):
            crashes.add_metric([stage], m.crashes)
        yield crashes
        refused = CounterMetricFamily("fleetpulse_topic_refused", "records the topic's validator refused, once per "
                                      "record in this worker (the sink dead-letters them)", labels=["topic"])
        for topic, n in sorted(self.metrics.refused.items()):
            refused.add_metric([topic], n)
        yield refused
        yield CounterMetricFamily("fleetpulse_recovery_rereads", "stalled table recoveries whose changelog partitions "
                                  "were read again from the record after the last applied one (the log has their "
                                  "consumer state)", value=self.metrics.recovery_rereads)
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


HEALTH_WINDOW_S = 60.0  # a stage whose lane crashed this recently is not healthy


def health(metrics: MetricsRegistry, now: float | None = None) -> tuple[bool, dict]:
    """(healthy, per stage: crashes in the last minute and in all, the last error) for /healthz."""
    stages = {name: {"crashes_last_minute": m.recent_crashes(HEALTH_WINDOW_S, now), "crashes": m.crashes,
                     **({"last_error": m.last_error} if m.last_error else {})} for name, m in sorted(metrics.items())}
    failing = sorted(name for name, st in stages.items() if st["crashes_last_minute"])
    return not failing, {"healthy": not failing, "failing": failing, "stages": stages}


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # no access log on stderr
        pass


def serve(metrics: MetricsRegistry, port: int, addr: str = "0.0.0.0", lag: Lag | None = None):
    """Serve /metrics and /healthz (200, or 503 naming the stages whose lane crashed in the last minute) from a daemon
    thread; returns the server (its `server_port` is the bound port)."""
    metrics_app = make_wsgi_app(registry_for(metrics, lag))

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            ok, body = health(metrics)
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
            return [orjson.dumps(body)]
        return metrics_app(environ, start_response)

    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="worker-metrics", daemon=True).start()
    log.info("worker metrics on http://%s:%d/metrics (health: /healthz)", addr, server.server_port)
    return server
