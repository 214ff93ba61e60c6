"""The agent's own metrics in Prometheus text: per collector (polls, errors, poll time) and the publisher's counters."""

from __future__ import annotations

import logging
from typing import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agents.publisher import Publisher
from agents.runner import AgentRunner
from agents.spool import SpoolingPublisher

log = logging.getLogger(__name__)


class AgentMetrics(Collector):
    """Reads the runner's and the publisher's counters at scrape time (nothing is counted twice)."""

    def __init__(self, runner: AgentRunner, publisher: Publisher | None = None):
        self.runner, self.publisher = runner, publisher

    def collect(self) -> Iterator[Metric]:
        host = self.runner.settings.agent_host
        up = GaugeMetricFamily("fleetpulse_agent_collector_up", "1 if the collector runs here, 0 if unsupported",
                               labels=["host", "collector"])
        polls = CounterMetricFamily("fleetpulse_agent_collector_polls", "polls of the collector",
                                    labels=["host", "collector"])
        errors = CounterMetricFamily("fleetpulse_agent_collector_errors", "polls that raised",
                                     labels=["host", "collector"])
        records = CounterMetricFamily("fleetpulse_agent_collector_records", "messages the collector produced",
                                      labels=["host", "collector"])
        last = GaugeMetricFamily("fleetpulse_agent_collector_last_poll_seconds", "duration of the latest poll",
                                 labels=["host", "collector"])
        failing = GaugeMetricFamily("fleetpulse_agent_collector_failing",
                                    "1 while the collector's latest poll raised (named in the agent's status)",
                                    labels=["host", "collector"])
        for name, state in list(self.runner.states.items()):
            labels = [host, name]
            up.add_metric(labels, 1.0 if state.supported else 0.0)
            polls.add_metric(labels, state.polls)
            errors.add_metric(labels, state.errors)
            records.add_metric(labels, state.records)
            last.add_metric(labels, state.last_poll_s)
            failing.add_metric(labels, 1.0 if state.failing else 0.0)
        status = CounterMetricFamily("fleetpulse_agent_status_records",
                                     "agent status records (fleet.telemetry.agent) handed to the publisher",
                                     labels=["host"])
        status.add_metric([host], self.runner.status_sent)
        yield from (up, polls, errors, records, last, failing, status)
        if self.publisher is not None:
            yield from self._publisher(host, self.publisher)

    def _publisher(self, host: str, pub: Publisher) -> Iterator[Metric]:
        sent = CounterMetricFamily("fleetpulse_agent_published", "records the broker acknowledged",
                                   labels=["host", "topic"])
        failed = CounterMetricFamily("fleetpulse_agent_publish_failed", "records refused for good",
                                     labels=["host", "topic"])
        for topic, n in list(pub.sent.items()):
            sent.add_metric([host, topic], n)
        for topic, n in list(pub.failed.items()):
            failed.add_metric([host, topic], n)
        yield from (sent, failed)
        if not isinstance(pub, SpoolingPublisher):
            return
        for name, help_text, value in (
                ("spooled", "records written to the on-disk spool", pub.spooled),
                ("replayed", "spooled records delivered after an outage or restart", pub.replayed),
                ("spool_dropped", "records given up: the oldest when the spool was full, and those the disk "
                                  "refused (full, quota) while the broker was away", pub.dropped),
                ("spool_corrupt", "damaged stretches of spool segments skipped (a torn write, a flipped byte)",
                 pub.spool.corrupt),
                ("spool_cursor_errors", "times the spool's delivery cursor could not be written",
                 pub.spool.cursor_errors),
                ("spool_pump_errors", "rounds of the spool replay that failed and were retried", pub.pump_errors),
                ("broker_outages", "times the broker stopped acknowledging", pub.outages)):
            family = CounterMetricFamily(f"fleetpulse_agent_{name}", help_text, labels=["host"])
            family.add_metric([host], value)
            yield family
        for name, help_text, value in (
                ("spool_bytes", "bytes of the spool on disk", pub.spool_bytes),
                ("spool_records", "records waiting in the spool", len(pub.spool)),
                ("broker_connected", "1 while records go straight to an acknowledging broker", int(pub.connected))):
            family = GaugeMetricFamily(f"fleetpulse_agent_{name}", help_text, labels=["host"])
            family.add_metric([host], value)
            yield family


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
