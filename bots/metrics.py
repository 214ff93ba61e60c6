"""A bot's own metrics in Prometheus text, under the words every role shares (core/metrics.py): requests received,
answers emitted, refused (malformed) records, errors (failed actions), time spent acting, and what its ledger holds.
How far behind the bot's consumer group is, in time, is `fleetpulse watch`'s fleetpulse_pipeline_lag_seconds (role
bot), read from the broker: a stuck bot cannot report it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bots.ledger import Ledger
from bots.runner import Counts
from core.errors import ConfigError
from core.metrics import MetricSpec, own, shared

log = logging.getLogger(__name__)


RECEIVED = shared("bot", "received", "requests read from fleet.drain.events", ["bot"])
REFUSED = shared("bot", "refused", "records that are not a drain event (the sink dead-letters them)", ["bot"])
EMITTED = shared("bot", "emitted", "answers sent on fleet.remediation.results, by action", ["bot", "action"])
ERRORS = shared("bot", "errors", "answers with ok false (the action failed), by action", ["bot", "action"])
BATCH = shared("bot", "batch_seconds", "one action (scheduler calls, commands), by action", ["bot", "action"])
LAG = shared("bot", "lag_seconds", "when the newest request was read (its event time, not its Kafka timestamp)",
             ["bot"])
STATE = shared("bot", "state_entries", "requests in the ledger not yet answered and sent", ["bot"])
SKIPPED = own("bot", "skipped", "counter", "requests not acted on: delivered again (duplicate), another cluster's "
              "host (not_ours), older than max_age_s (stale)", ["bot", "why"])
LAST = own("bot", "last_request_timestamp_seconds", "gauge", "event time of the newest request read", ["bot"])
CATALOGUE: tuple[MetricSpec, ...] = (RECEIVED, REFUSED, EMITTED, ERRORS, BATCH, LAG, STATE, SKIPPED, LAST)


class BotMetrics(Collector):
    """Reads the runner's counts and the ledger at scrape time."""

    def __init__(self, bot: str, counts: Counts, ledger: Ledger):
        self.bot, self.counts, self.ledger = bot, counts, ledger

    def collect(self) -> Iterator[Metric]:
        c, bot = self.counts, [self.bot]
        yield RECEIVED.of([(bot, c.received)])
        yield REFUSED.of([(bot, c.malformed)])
        yield SKIPPED.of(([self.bot, why], n) for why, n in (("duplicate", c.duplicates), ("not_ours", c.not_ours),
                                                              ("stale", c.stale)))
        actions = sorted({*c.answered, *c.failed, *c.action_seconds})
        yield EMITTED.of(([self.bot, a], c.answered.get(a, 0)) for a in actions)
        yield ERRORS.of(([self.bot, a], c.failed.get(a, 0)) for a in actions)
        yield BATCH.of(([self.bot, a], c.action_seconds[a]) for a in actions if a in c.action_seconds)
        yield STATE.of([(bot, len(self.ledger.unsettled()))])
        if c.last_event_ts is not None:
            yield LAG.of([(bot, c.lag_s)])
            yield LAST.of([(bot, c.last_event_ts)])


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
