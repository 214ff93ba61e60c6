"""Per-stage counters (received, emitted, errored, batch latency) and per-topic refusals; streams/metrics_server.py serves them."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from dataclasses import dataclass, field

# Upper bounds (seconds) of the batch-latency histogram buckets, Prometheus style (le=...).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class StageMetrics:
    """Counters of one stage, named after its registry name (the Prometheus `stage` label)."""

    stage: str
    received: int = 0  # records taken from the input topic(s)
    emitted: int = 0  # records produced to the stage's output topics (not dead letters, not repartitions)
    errored: int = 0  # records this stage dead-lettered (internal records, or rules that raised)
    batches: int = 0
    latency_sum_s: float = 0.0
    latency_max_s: float = 0.0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    crashes: int = 0  # times its lane's loop raised (once: the lane then takes no more records, the worker stops)
    crash_times: list[float] = field(default_factory=list)  # monotonic, the most recent few
    last_error: str = ""

    def crashed(self, exc: BaseException, now: float | None = None) -> None:
        self.crashes += 1
        self.crash_times = [*self.crash_times[-19:], time.monotonic() if now is None else now]
        self.last_error = repr(exc)[:500]

    def recent_crashes(self, window_s: float, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(1 for t in self.crash_times if now - t <= window_s)

    def observe_batch(self, seconds: float) -> None:
        """Record how long one batch took, from taking it to its outputs being acknowledged by the broker."""
        self.batches += 1
        self.latency_sum_s += seconds
        self.latency_max_s = max(self.latency_max_s, seconds)
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def snapshot(self) -> dict[str, float]:
        return {"received": self.received, "emitted": self.emitted, "errored": self.errored,
                "batches": self.batches, "latency_sum_s": self.latency_sum_s, "latency_max_s": self.latency_max_s}


class MetricsRegistry(dict[str, StageMetrics]):
    """Stage name -> StageMetrics, and per input topic the records its validator refused (counted once per worker,
    however many stages read the topic); one per app."""

    def __init__(self):
        super().__init__()
        self.refused: Counter[str] = Counter()
        self.recovery_rereads = 0  # stalled table recoveries whose changelog partitions were read again (ReRead)

    def stage(self, name: str) -> StageMetrics:
        return self.setdefault(name, StageMetrics(name))
