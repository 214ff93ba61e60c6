"""The agent's own metrics in Prometheus text, under the words every role shares (core/metrics.py): per collector
(records made, polls, errors, poll time) and the publisher's counters (acknowledged, refused, spooled)."""

from __future__ import annotations

import logging
from typing import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from agents.publisher import Publisher
from agents.runner import AgentRunner
from agents.spool import SpoolingPublisher
from core.metrics import MetricSpec, own, shared

log = logging.getLogger(__name__)


COLLECTOR = ["host", "collector"]
RECEIVED = shared("agent", "received", "messages the collector made from its source (NVML, DCGM, the kernel log)",
                  COLLECTOR)
EMITTED = shared("agent", "emitted", "records the broker acknowledged", ["host", "topic"])
ERRORS = shared("agent", "errors", "polls that raised", COLLECTOR)
BATCH = shared("agent", "batch_seconds", "one poll of the collector", COLLECTOR)
STATE = shared("agent", "state_entries", "records waiting in the on-disk spool", ["host"])
UP = own("agent", "collector_up", "gauge", "1 if the collector runs here, 0 if unsupported", COLLECTOR)
POLLS = own("agent", "collector_polls", "counter", "polls of the collector", COLLECTOR)
FAILING = own("agent", "collector_failing", "gauge", "1 while the collector's latest poll raised (named in the "
              "agent's status)", COLLECTOR)
STATUS = own("agent", "status_records", "counter", "agent status records (fleet.telemetry.agent) handed to the "
             "publisher", ["host"])
PUBLISH_FAILED = own("agent", "publish_failed", "counter", "records the broker refused for good (too large, unknown "
                     "topic)", ["host", "topic"])
SPOOL_COUNTERS = (
    (own("agent", "spooled", "counter", "records written to the on-disk spool", ["host"]), lambda p: p.spooled),
    (own("agent", "replayed", "counter", "spooled records delivered after an outage or restart", ["host"]),
     lambda p: p.replayed),
    (own("agent", "spool_dropped", "counter", "records given up: the oldest when the spool was full, and those the "
         "disk refused (full, quota) while the broker was away", ["host"]), lambda p: p.dropped),
    (own("agent", "spool_corrupt", "counter", "damaged stretches of spool segments skipped (a torn write, a flipped "
         "byte)", ["host"]), lambda p: p.spool.corrupt),
    (own("agent", "spool_cursor_errors", "counter", "times the spool's delivery cursor could not be written",
         ["host"]), lambda p: p.spool.cursor_errors),
    (own("agent", "spool_pump_errors", "counter", "rounds of the spool replay that failed and were retried",
         ["host"]), lambda p: p.pump_errors),
    (own("agent", "broker_outages", "counter", "times the broker stopped acknowledging", ["host"]),
     lambda p: p.outages),
    (own("agent", "spool_bytes", "gauge", "bytes of the spool on disk", ["host"]), lambda p: p.spool_bytes),
    (STATE, lambda p: len(p.spool)),
    (own("agent", "broker_connected", "gauge", "1 while records go straight to an acknowledging broker", ["host"]),
     lambda p: int(p.connected)))
CATALOGUE: tuple[MetricSpec, ...] = (RECEIVED, EMITTED, ERRORS, BATCH, UP, POLLS, FAILING, STATUS, PUBLISH_FAILED,
                                     *(spec for spec, _ in SPOOL_COUNTERS))


class AgentMetrics(Collector):
    """Reads the runner's and the publisher's counters at scrape time (nothing is counted twice)."""

    def __init__(self, runner: AgentRunner, publisher: Publisher | None = None):
        self.runner, self.publisher = runner, publisher

    def collect(self) -> Iterator[Metric]:
        host = self.runner.settings.agent_host
        states = list(self.runner.states.items())
        yield UP.of(([host, name], 1.0 if st.supported else 0.0) for name, st in states)
        yield POLLS.of(([host, name], st.polls) for name, st in states)
        yield ERRORS.of(([host, name], st.errors) for name, st in states)
        yield RECEIVED.of(([host, name], st.records) for name, st in states)
        yield BATCH.of(([host, name], st.latency) for name, st in states)
        yield FAILING.of(([host, name], 1.0 if st.failing else 0.0) for name, st in states)
        yield STATUS.of([([host], self.runner.status_sent)])
        pub = self.publisher
        if pub is None:
            return
        yield EMITTED.of(([host, topic], n) for topic, n in list(pub.sent.items()))
        yield PUBLISH_FAILED.of(([host, topic], n) for topic, n in list(pub.failed.items()))
        if isinstance(pub, SpoolingPublisher):
            yield from (spec.of([([host], value(pub))]) for spec, value in SPOOL_COUNTERS)


def registry_for(runner: AgentRunner, publisher: Publisher | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentMetrics(runner, publisher))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
    return registry


def exposition(runner: AgentRunner, publisher: Publisher | None = None) -> str:
    """The text a scrape returns (for tests and `--once`-style diagnostics)."""
    return generate_latest(registry_for(runner, publisher)).decode()


def serve(runner: AgentRunner, publisher: Publisher | None, port: int, addr: str = "0.0.0.0"):
    """Serve /metrics from a daemon thread; returns the server (its `server_port` is the bound port)."""
    server, _thread = start_http_server(port, addr, registry=registry_for(runner, publisher))
    log.info("agent metrics on http://%s:%d/metrics", addr, server.server_port)
    return server
