"""A bot's own metrics in Prometheus text, under the names every role uses for the same things: requests received,
answers emitted, refused (malformed) records, errors (failed actions), time spent acting, and what its ledger holds.
How far behind the bot's consumer group is, in time, is `fleetpulse watch`'s fleetpulse_pipeline_lag_seconds (role
bot), read from the broker: a stuck bot cannot report it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bots.ledger import Ledger
from bots.runner import Counts
from core.errors import ConfigError

log = logging.getLogger(__name__)


class BotMetrics(Collector):
    """Reads the runner's counts and the ledger at scrape time."""

    def __init__(self, bot: str, counts: Counts, ledger: Ledger):
        self.bot, self.counts, self.ledger = bot, counts, ledger

    def collect(self) -> Iterator[Metric]:
        c, bot = self.counts, [self.bot]
        yield _one("fleetpulse_bot_received", "requests read from fleet.drain.events", bot, c.received)
        yield _one("fleetpulse_bot_refused", "records that are not a drain event (the sink dead-letters them)", bot,
                   c.malformed)
        skipped = CounterMetricFamily("fleetpulse_bot_skipped", "requests not acted on: delivered again "
                                      "(duplicate), another cluster's host (not_ours), older than max_age_s (stale)",
                                      labels=["bot", "why"])
        for why, n in (("duplicate", c.duplicates), ("not_ours", c.not_ours), ("stale", c.stale)):
            skipped.add_metric([self.bot, why], n)
        yield skipped
        actions = sorted({*c.answered, *c.failed, *c.action_seconds})
        for name, help_text, values in (
                ("fleetpulse_bot_emitted", "answers sent on fleet.remediation.results, by action", c.answered),
                ("fleetpulse_bot_errors", "answers with ok false (the action failed), by action", c.failed),
                ("fleetpulse_bot_action_seconds", "time spent acting (scheduler calls, commands), by action",
                 c.action_seconds)):
            family = CounterMetricFamily(name, help_text, labels=["bot", "action"])
            for action in actions:
                family.add_metric([self.bot, action], values.get(action, 0))
            yield family
        state = GaugeMetricFamily("fleetpulse_bot_state_entries", "requests in the ledger not yet answered and sent",
                                  labels=["bot"])
        state.add_metric(bot, len(self.ledger.unsettled()))
        yield state
        if c.last_event_ts is not None:
            last = GaugeMetricFamily("fleetpulse_bot_last_request_timestamp_seconds",
                                     "event time of the newest request read", labels=["bot"])
            last.add_metric(bot, c.last_event_ts)
            yield last


def _one(name: str, help_text: str, bot: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=["bot"])
    family.add_metric(bot, value)
    return family


def registry_for(bot: str, counts: Counts, ledger: Ledger) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BotMetrics(bot, counts, ledger))
    ProcessCollector(registry=registry)
    return registry


def serve(bot: str, counts: Counts, ledger: Ledger, port: int, addr: str):
    """Serve /metrics from a daemon thread; returns the server (its `server_port` is the bound port)."""
    try:
        server, _thread = start_http_server(port, addr, registry=registry_for(bot, counts, ledger))
    except OSError as exc:
        raise ConfigError(f"FLEETPULSE_BOT_METRICS_PORT {port}: {exc.strerror}; choose a free port, or leave it "
                          "unset") from None
    log.info("bot metrics on http://%s:%d/metrics", addr, server.server_port)
    return server
