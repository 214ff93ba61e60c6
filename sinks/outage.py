"""How the sink waits out a store (or broker) that is away: every write it makes goes through `Outages.call`.

An error that waiting mends (core/clickhouse.py ERRORS: the server down or restarting, a timeout, TOO_MANY_PARTS, a
quota used up, memory, disk, a retriable Kafka error of a dead letter) is tried again after 0.2 s, doubling to
`wait_max_s`, for as long as it lasts: the sink never gives up on what time mends. The outage is logged when it
begins, once a minute while it lasts (for how long, which error, how many tries) and when it ends; `state()` is what
/status and /metrics show. An error waiting cannot mend (a missing table, no permission, rows the store refuses) is
raised to the caller at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka.errors import KafkaError

from core.errors import StoreError

log = logging.getLogger("fleetpulse.sink")
T = TypeVar("T")


def mends_by_waiting(exc: BaseException) -> bool:
    """Whether trying the same call later can succeed: the store's error table says so, or Kafka calls it retriable."""
    if isinstance(exc, StoreError):
        return exc.action == StoreError.WAIT
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


@dataclass
class Outage:
    began: float  # monotonic
    began_at: float  # wall clock, for /status
    what: str  # the call that met it first
    error: str  # the latest error
    name: str  # its ClickHouse name (TOO_MANY_PARTS, unreachable, ...) or Kafka error class
    tries: int = 0
    last_report: float = 0.0


@dataclass
class Outages:
    wait_max_s: float = 5.0
    first_wait_s: float = 0.2
    report_every_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    current: Outage | None = None
    count: int = 0  # outages so far
    waited_s: float = 0.0  # in outages that ended
    by_error: dict[str, int] = field(default_factory=dict)  # failed tries per error name

    async def call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """`await fn()`, tried again for as long as it fails with what waiting mends."""
        delay = self.first_wait_s
        while True:
            try:
                result = await fn()
            except Exception as exc:
                if not mends_by_waiting(exc):
                    raise
                self._failed(what, exc)
                await self.sleep(delay)
                delay = min(delay * 2, self.wait_max_s)
                continue
            if self.current is not None:
                self._ended()
            return result

    def _failed(self, what: str, exc: Exception) -> None:
        now = self.clock()
        name = getattr(exc, "name", None) or type(exc).__name__
        self.by_error[name] = self.by_error.get(name, 0) + 1
        if self.current is None:
            self.count += 1
            self.current = Outage(now, time.time(), what, str(exc), name, last_report=now)
            log.warning("the store is not taking writes (%s): the sink holds its batch and pauses consuming, "
                        "trying again every %g s at most until it does", _said(what, exc), self.wait_max_s)
        outage = self.current
        outage.tries += 1
        outage.error, outage.name = str(exc), name
        if now - outage.last_report >= self.report_every_s:
            outage.last_report = now
            log.warning("still waiting for the store after %.0f s (%d tries; last: %s)", now - outage.began,
                        outage.tries, _said(what, exc))

    def _ended(self) -> None:
        outage, self.current = self.current, None
        lasted = self.clock() - outage.began
        self.waited_s += lasted
        log.warning("the store takes writes again after %.1f s (%d tries, %s); the sink resumes", lasted,
                    outage.tries, outage.name)

    @property
    def waiting(self) -> bool:
        return self.current is not None

    def state(self) -> dict:
        """For /status: whether the sink is waiting, since when and on what, and the outages so far."""
        out: dict = {"waiting": self.waiting, "outages": self.count, "waited_s": round(self.total_waited_s(), 1),
                     "failed_tries": dict(self.by_error)}
        if self.current is not None:
            o = self.current
            out["current"] = {"since": o.began_at, "for_s": round(self.clock() - o.began, 1), "what": o.what,
                              "error": o.name, "message": _short(o.error), "tries": o.tries}
        return out

    def total_waited_s(self) -> float:
        return self.waited_s + (self.clock() - self.current.began if self.current is not None else 0.0)


def _said(what: str, exc: BaseException) -> str:
    """The error as a log line says it: a store error names its call already, a Kafka error does not."""
    return _short(exc) if isinstance(exc, StoreError) else f"{what}: {type(exc).__name__}: {_short(exc)}"


def _short(exc: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "…"
