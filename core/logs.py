"""Kafka client chatter that means nothing to an operator, kept out of the way of what does.

On a new topic, a leader election or a rebalance, aiokafka logs ERRORs and WARNINGs (`NotLeaderForPartitionError`,
`GroupCoordinatorNotAvailableError`, `Unable connect to node`) for states it retries and heals by itself within
seconds; an operator reading them cannot tell them from a real fault, which drowns in them. So a condition like that
is logged at DEBUG while it is new; if it lasts `grace_s` it is shown, once per `every_s`, with how long it has lasted
and how often it was seen (a broker really down, a topic never created). It lasts while it comes back within `gap_s`:
a client retrying a state that does not heal logs it every second or so, while brief states a minute apart (each new
topic's leader election, a benchmark's runs) are separate episodes, each new, and were once shown as one outage of
minutes. Anything else — an authentication failure, a record too large — passes untouched.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable

TRANSIENT = re.compile(
    r"NotLeaderForPartition|LeaderNotAvailable|GroupCoordinatorNotAvailable|NotCoordinatorForGroup|"
    r"CoordinatorLoadInProgress|UnknownTopicOrPartition|RebalanceInProgress|NodeNotReady|RequestTimedOut|"
    r"Unable connect to node|Unable to update metadata|Unable to request metadata|Connect call failed|"
    r"KafkaConnectionError|"
    r"Topic .{1,300} not found in cluster metadata")
CLIENT_LOGGERS = ("aiokafka", "kafka", "faust.transport")
# The HTTP clients under clickhouse-connect log each failed try of a store that is away (urllib3 with the whole
# request URL, some 10 KB for an insert); the caller that waits says what it waits for, once a minute (sinks/outage.py).
STORE_CLIENT_LOGGERS = ("urllib3.connectionpool", "clickhouse_connect.driver")


class TransientClientNoise(logging.Filter):
    """Demotes self-healing client states to DEBUG until they have lasted `grace_s` (see the module's doc)."""

    def __init__(self, grace_s: float = 60.0, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 gap_s: float = 15.0):
        super().__init__()
        self.grace_s, self.every_s, self.gap_s, self.clock = grace_s, every_s, gap_s, clock
        self.episodes: dict[str, list[float]] = {}  # condition -> [began, last seen, last shown, times seen]
        self.demoted = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "client_noise_judged", False):
            return True  # (a record this filter judged on its logger meets it again on the root's handlers)
        record.client_noise_judged = True
        match = TRANSIENT.search(record.getMessage())
        if match is None:
            return True
        kind, now = match.group(0).split(" ")[0], self.clock()
        episode = self.episodes.get(kind)
        if episode is None or now - episode[1] > self.gap_s:  # not seen for gap_s: that one ended, this one is new
            episode = self.episodes[kind] = [now, now, -math.inf, 0]
        episode[1] = now
        episode[3] += 1
        if now - episode[0] < self.grace_s or now - episode[2] < self.every_s:
            self.demoted += 1
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        episode[2] = now
        record.msg = f"[{kind} for {now - episode[0]:.0f} s, {episode[3]} times] {record.msg}"
        return True


def quiet_transient_client_logs(grace_s: float = 60.0) -> TransientClientNoise:
    """Install one filter on every Kafka client logger that exists now (call it after importing the clients) and on
    the root logger's handlers, and keep the store's HTTP clients to their errors; returns the filter (its `demoted`
    counts what it kept out of the way)."""
    noise = TransientClientNoise(grace_s, grace_s)
    names = [n for n in logging.root.manager.loggerDict if n.startswith(CLIENT_LOGGERS)] + list(CLIENT_LOGGERS)
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, TransientClientNoise) for f in logger.filters):
            logger.addFilter(noise)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, TransientClientNoise) for f in handler.filters):
            handler.addFilter(noise)
    for name in STORE_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    return noise


class LogBudget:
    """At most `per_minute` lines of one kind a minute (a flood of bad records must not become a flood of log lines);
    `take()` says whether to log this one and how many were held back since the last one logged."""

    def __init__(self, per_minute: int = 20, clock: Callable[[], float] = time.monotonic):
        self.per_minute, self.clock = per_minute, clock
        self.window_start, self.used, self.held = -math.inf, 0, 0

    def take(self) -> tuple[bool, int]:
        now = self.clock()
        if now - self.window_start >= 60.0:
            self.window_start, self.used = now, 0
        if self.used >= self.per_minute:
            self.held += 1
            return False, 0
        self.used += 1
        held, self.held = self.held, 0
        return True, held

    def suffix(self, held: int) -> str:
        return f" ({held} more like it not shown)" if held else ""
