"""The words every role's Prometheus metrics share, and the catalogue each role declares (docs/metrics.md is written
from the catalogues, and tests/test_metrics_compliance.py holds every role to them).

A role's metric is `fleetpulse_<role>_<thing>`. The same thing has the same name, kind and meaning in every role; a
label says which part of the role (a stage, a table, a bot's action, a collector, a page route):

- `received` (counter): records or requests taken from the role's inputs.
- `emitted` (counter): what the role handed on: records sent to its output topics, rows stored, answers sent.
- `refused` (counter): records a topic's validator refused as malformed; each gets one dead letter in the pipeline.
- `errors` (counter): work that failed: a rule that raised, a store call tried again, an action that failed, a poll
  or an answer that raised.
- `batch_seconds` (histogram): how long one unit of work took: a batch, an insert, an action, a poll, an answer.
- `lag_seconds` (gauge): event-time lag: when the newest record was handled, minus the time it was made (its Kafka
  timestamp). A role that is stuck cannot say so itself: `fleetpulse watch` reads every group's lag from the broker.
- `state_entries` (gauge): entries the role holds in its state (table keys, ledger entries, spooled records).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

SHARED: dict[str, tuple[str, str]] = {
    "received": ("counter", "records or requests taken from the role's inputs"),
    "emitted": ("counter", "what the role handed on: records sent, rows stored, answers sent"),
    "refused": ("counter", "records a topic's validator refused as malformed (one dead letter each in the pipeline)"),
    "errors": ("counter", "work that failed"),
    "batch_seconds": ("histogram", "how long one unit of work took"),
    "lag_seconds": ("gauge", "event-time lag: when the newest record was handled minus its Kafka timestamp"),
    "state_entries": ("gauge", "entries held in the role's state"),
}

# Upper bounds (seconds) of every batch_seconds histogram's buckets, Prometheus style (le=...).
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_FAMILIES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}


@dataclass(frozen=True)
class MetricSpec:
    """One metric a role serves: its name (without a counter's `_total`), kind, help text and labels."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    thing: str | None = None  # the shared word it is named after (shared()), or None: the role's own

    def family(self, value: float | None = None):
        """An empty family to add labelled samples to, or (no labels) one holding `value`."""
        cls = _FAMILIES[self.kind]
        if not self.labels:
            return cls(self.name, self.help, value=value if value is not None else 0)
        return cls(self.name, self.help, labels=list(self.labels))

    def of(self, samples: Iterable[tuple[Iterable[str], float | Latency]]):
        """The family with one sample per (label values, value); a histogram's value is a Latency."""
        family = self.family()
        for labels, value in samples:
            if isinstance(value, Latency):
                family.add_metric(list(labels), value.buckets(), value.sum_s)
            else:
                family.add_metric(list(labels), value)
        return family


def shared(role: str, thing: str, detail: str, labels: Iterable[str] = ()) -> MetricSpec:
    """`fleetpulse_<role>_<thing>`, of the kind every role gives `thing`; `detail` says what it is in this role."""
    return MetricSpec(f"fleetpulse_{role}_{thing}", SHARED[thing][0], detail, tuple(labels), thing)


def own(role: str, name: str, kind: str, help_text: str, labels: Iterable[str] = ()) -> MetricSpec:
    """A metric only this role has (`name` must not be one of the shared words)."""
    if name in SHARED:
        raise ValueError(f"{name} is a shared word: use shared()")
    return MetricSpec(f"fleetpulse_{role}_{name}", kind, help_text, tuple(labels))


@dataclass
class EventLag:
    """A lag_seconds gauge's value: when the latest unit of work was done, minus the Kafka timestamp of its newest
    record. A unit without timestamps keeps the last value; `newest_ts_ms` is 0 until one had any (nothing to say)."""

    newest_ts_ms: int = 0
    lag_s: float = 0.0

    def observe(self, newest_ts_ms: int, now: float | None = None) -> None:
        if newest_ts_ms:
            self.newest_ts_ms = newest_ts_ms
            self.lag_s = max(0.0, (time.time() if now is None else now) - newest_ts_ms / 1000)


@dataclass
class Latency:
    """A batch_seconds histogram's counts: how many units of work took up to each bound, their sum and the most."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0
    max_s: float = 0.0

    @property
    def n(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sum_s += seconds
        self.max_s = max(self.max_s, seconds)

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, +Inf last, as Prometheus histograms have them."""
        out, total = [], 0
        for bound, count in zip((*map(str, BUCKETS_S), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out
