"""The stream worker's counters as Prometheus text on a port, the way the agent serves its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from core.metrics import MetricSpec, own, shared
from streams.metrics import MetricsRegistry

log = logging.getLogger("fleetpulse.streams")
Lag = Callable[[], Mapping[str, int]]  # stage -> records on its inputs not yet processed

RECEIVED = shared("stage", "received", "records taken from the stage's inputs", ["stage"])
EMITTED = shared("stage", "emitted", "records sent to its output topics", ["stage"])
ERRORS = shared("stage", "errors", "records it dead-lettered (its internal records, or its rules raised)", ["stage"])
BATCH = shared("stage", "batch_seconds", "from taking a batch to its outputs and state being acknowledged",
               ["stage"])
LAG = shared("stage", "lag_seconds", "when the stage's latest batch was done, minus the Kafka timestamp of its "
             "newest record", ["stage"])
STATE = shared("stage", "state_entries", "keys in the stage's tables on the partitions this worker holds",
               ["stage"])
REFUSED = shared("worker", "refused", "counted once per record in this worker, whichever stages read its topic (the "
                 "sink dead-letters them)", ["topic"])
CRASHES = own("stage", "crashes", "counter", "times the stage's lane loop raised and was restarted (/healthz fails "
              "for a minute after each)", ["stage"])
LAG_RECORDS = own("stage", "lag_records", "gauge", "records on the stage's input partitions that this worker holds "
                  "and has not processed yet", ["stage"])
REREADS = own("worker", "recovery_rereads", "counter", "stalled table recoveries whose changelog partitions were read "
              "again from the record after the last applied one (the log has their consumer state)")
CATALOGUE: tuple[MetricSpec, ...] = (RECEIVED, EMITTED, ERRORS, BATCH, LAG, STATE, REFUSED, CRASHES, LAG_RECORDS,
                                     REREADS)


class WorkerMetrics(Collector):
    """Reads the stages' counters at scrape time; `lag` (optional) reports each stage's unprocessed input records."""

    def __init__(self, metrics: MetricsRegistry, lag: Lag | None = None):
        self.metrics, self.lag = metrics, lag

    def collect(self) -> Iterator[Metric]:
        stages = sorted(self.metrics.items())
        yield RECEIVED.of(([s], m.received) for s, m in stages)
        yield EMITTED.of(([s], m.emitted) for s, m in stages)
        yield ERRORS.of(([s], m.errors) for s, m in stages)
        yield BATCH.of(([s], m.latency) for s, m in stages)
        yield LAG.of(([s], m.lag.lag_s) for s, m in stages if m.lag.newest_ts_ms)
        yield STATE.of(([s], m.state_entries) for s, m in stages if m.state_entries is not None)
        yield CRASHES.of(([s], m.crashes) for s, m in stages)
        yield REFUSED.of(([topic], n) for topic, n in sorted(self.metrics.refused.items()))
        yield REREADS.family(self.metrics.recovery_rereads)
        if self.lag is not None:
            yield LAG_RECORDS.of(([stage], n) for stage, n in sorted(self.lag().items()))


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
