"""Per-stage counters (received, emitted, errors, batch latency, event-time lag, state size) and per-topic refusals,
under the words every role shares (core/metrics.py); streams/metrics_server.py serves them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from core.metrics import EventLag, Latency


@dataclass
class StageMetrics:
    """Counters of one stage, named after its registry name (the Prometheus `stage` label)."""

    stage: str
    received: int = 0  # records taken from the input topic(s)
    emitted: int = 0  # records produced to the stage's output topics (not dead letters, not repartitions)
    errors: int = 0  # records this stage dead-lettered (internal records, or rules that raised)
    latency: Latency = field(default_factory=Latency)
    lag: EventLag = field(default_factory=EventLag)  # of the latest batch done
    state_entries: int | None = None  # keys in the stage's tables this worker holds, after its latest batch
    crashes: int = 0  # times its lane's loop raised (once: the lane then takes no more records, the worker stops)
    crash_times: list[float] = field(default_factory=list)  # monotonic, the most recent few
    last_error: str = ""

    @property
    def batches(self) -> int:
        return self.latency.n

    def crashed(self, exc: BaseException, now: float | None = None) -> None:
        self.crashes += 1
        self.crash_times = [*self.crash_times[-19:], time.monotonic() if now is None else now]
        self.last_error = repr(exc)[:500]

    def recent_crashes(self, window_s: float, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(1 for t in self.crash_times if now - t <= window_s)

    def observe_batch(self, seconds: float, newest_ts_ms: int = 0, now: float | None = None) -> None:
        """Record one batch: how long it took, from taking it to its outputs and state being acknowledged, and the
        event-time lag of its newest record (its Kafka timestamp) when it was done."""
        self.latency.observe(seconds)
        self.lag.observe(newest_ts_ms, now)


class MetricsRegistry(dict[str, StageMetrics]):
    """Stage name -> StageMetrics, and per input topic the records its validator refused (counted once per worker,
    however many stages read the topic); one per app."""

    def __init__(self):
        super().__init__()
        self.refused: Counter[str] = Counter()
        self.recovery_rereads = 0  # stalled table recoveries whose changelog partitions were read again (ReRead)

    def stage(self, name: str) -> StageMetrics:
        return self.setdefault(name, StageMetrics(name))
