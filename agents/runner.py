"""AgentRunner: runs the chosen host collectors on their cadence (blocking calls in threads), publishes the output
and the agent's own condition (AgentStatus on fleet.telemetry.agent)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel

from agents.nvml import Nvml
from agents.publisher import Publisher
from agents.registry import BuildContext, Collector, CollectorSpec, chosen_specs, messages, unsupported_reason
from agents.settings import AgentSettings
from core.errors import BrokerError
from core.metrics import Latency
from schemas.events import AgentStatus
from schemas.topics import AGENT, Topic

log = logging.getLogger(__name__)
ERROR_MAX = 500  # characters of a failing collector's error in its status record


@dataclass
class CollectorState:
    """One chosen collector: its instance, whether it runs here, and its counters (the agent's metrics)."""

    spec: CollectorSpec
    collector: Collector | None = None
    supported: bool = False
    reason: str | None = None
    polls: int = 0
    errors: int = 0
    records: int = 0
    last_poll_s: float = 0.0
    latency: Latency = field(default_factory=Latency)  # every poll's duration
    last_error: str | None = None
    failing: bool = False  # the last poll raised: named in the agent's status until a poll succeeds
    busy: asyncio.Future | None = None  # the sample() running in a thread right now
    task: asyncio.Task | None = None


class AgentRunner:
    """Probes every chosen collector once (unsupported ones are logged once and skipped), then polls the rest:
    samples every `agent_interval_s` on a fixed schedule, event sources (XIDs, NCCL) every `agent_event_poll_s`
    or as soon as the previous poll found something. Each poll runs in a thread (`asyncio.to_thread`), so a slow
    NVML call or exporter scrape never stalls the others or the publisher. Unsupported collectors are probed again
    every `agent_recheck_s` (a driver that loads late, an exporter that starts late), quietly.

    Next to the collectors' output the agent publishes its own condition (AgentStatus): which collectors run, which
    fail and why, which are unsupported; at start, every `agent_status_every_s`, at once when that changes, and a
    last one saying "stopping" on an orderly stop. Without it the pipeline (streams/silence/) could not tell a host
    gone silent (nothing at all: drain it) from a broken monitor (status saying NVML fails, no samples: alert, never
    drain) or from a planned stop (a goodbye, then nothing: no fault).
    """

    status_min_gap_s = 1.0  # changes within this long of the last status wait and share one record (a burst, a flap)

    def __init__(self, settings: AgentSettings, *, publisher: Publisher | None = None, nvml: Nvml | None = None):
        self.settings, self.publisher = settings, publisher
        self.ctx = BuildContext(settings, nvml)
        self.states: dict[str, CollectorState] = {spec.name: CollectorState(spec) for spec in chosen_specs(settings)}
        self.publish_errors = 0
        self.status_seq = 0  # AgentStatus.seq of the next status record; per process
        self.status_sent = 0  # status records the publisher took
        self._status_due = asyncio.Event()  # a collector started or stopped running or failing

    # -- probing ---------------------------------------------------------------------------------------------------
    async def probe(self, *, announce: bool = True) -> None:
        """Build and probe every collector not yet running (in order: nvml_xid must exist before nvml is built)."""
        for state in self.states.values():
            if not state.supported:
                await asyncio.to_thread(self._probe, state, announce)
                if state.supported:
                    self._status_due.set()

    def _probe(self, state: CollectorState, announce: bool) -> None:
        name = state.spec.name
        try:
            collector = state.spec.build(self.ctx)
            supported = collector.is_supported()
            reason = None if supported else unsupported_reason(collector)
        except Exception as exc:  # a probe that blows up means "not here", never a crash of the agent
            collector, supported, reason = None, False, f"probe failed: {exc!r}"
        if not supported and collector is not None:
            with contextlib.suppress(Exception):
                collector.close()
            collector = None
        state.collector, state.supported, state.reason = collector, supported, reason
        if supported:
            log.info("collector %s: running on %s", name, self.settings.agent_host)
        elif announce:
            log.warning("collector %s: unsupported on %s: %s (skipped)", name, self.settings.agent_host, reason)

    # -- polling ---------------------------------------------------------------------------------------------------
    async def poll(self, state: CollectorState) -> list[tuple[Topic, BaseModel]]:
        """One sample() in a thread -> the (topic, message) pairs it yields; errors are counted, not raised."""
        started = time.perf_counter()
        state.busy = asyncio.ensure_future(asyncio.to_thread(state.collector.sample))
        try:
            result = await self._outlast(state)
        except Exception as exc:
            state.errors += 1
            if repr(exc) != state.last_error:  # log a new kind of failure, not every repeat of it
                log.warning("collector %s: %r", state.spec.name, exc)
            state.last_error = repr(exc)
            self._set_failing(state, True)
            return []
        finally:
            state.polls += 1
            state.last_poll_s = time.perf_counter() - started
            state.latency.observe(state.last_poll_s)
        self._set_failing(state, False)
        out = messages(result, self.settings.agent_job)
        state.records += len(out)
        return out

    async def _outlast(self, state: CollectorState) -> Any:
        """The poll's result; a poll still running after `agent_poll_stall_s` is a stalled collector: the status says
        so at once, naming the call it hangs in (a thread cannot be stopped: the poll is waited out, and its collector
        loop with it, while the status loop goes on), and logs it; a stall is how a dying GPU or driver often shows
        first (NVSentinel issue 1748: a degrading GPU stalled DCGM, its monitor restarted 49 times, nothing said)."""
        busy, limit = state.busy, self.settings.agent_poll_stall_s
        done, _ = await asyncio.wait({busy}, timeout=limit)
        if not done:
            doing = getattr(state.collector, "doing", None)
            where = doing() if callable(doing) else None
            state.last_error = (f"stalled: {state.spec.name} poll has not returned in {limit:g} s"
                                + (f" (in {where})" if where else "") + ": a call into the driver or exporter hangs")
            log.error("collector %s: %s", state.spec.name, state.last_error)
            self._set_failing(state, True)
            await asyncio.wait({busy})
        return busy.result()

    def _set_failing(self, state: CollectorState, failing: bool) -> None:
        if state.failing != failing:
            state.failing = failing
            self._status_due.set()

    async def _publish(self, out: list[tuple[Topic, BaseModel]]) -> None:
        for topic, message in out:
            try:
                await self.publisher.send(topic, message)
            except BrokerError as exc:  # refused for good (too large, ...): counted by the publisher too
                self.publish_errors += 1
                log.error("publish to %s failed: %s", topic.name, exc)

    async def _run_collector(self, state: CollectorState) -> None:
        s = self.settings
        period = s.agent_event_poll_s if state.spec.continuous else s.agent_interval_s
        next_at = time.monotonic()
        while True:
            out = await self.poll(state)
            await self._publish(out)
            if state.spec.continuous and out:
                next_at = time.monotonic()  # more may be queued: read again at once
            else:
                next_at += period
                if next_at < time.monotonic():  # fell behind (a slow poll): skip the missed ticks
                    next_at = time.monotonic() + period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(self.settings.agent_recheck_s)
            await self.probe(announce=False)
            self._start_loops()

    def _start_loops(self) -> None:
        for state in self.states.values():
            if state.supported and state.task is None:
                state.task = asyncio.create_task(self._run_collector(state), name=f"collector-{state.spec.name}")

    # -- status ----------------------------------------------------------------------------------------------------
    def status(self, state: Literal["running", "stopping"] = "running") -> AgentStatus:
        """The agent's own condition now, numbered with the next `status_seq`."""
        s, running = self.settings, [c for c in self.states.values() if c.supported]
        status = AgentStatus(
            **self.ctx.labels, job=s.agent_job, ts=time.time(), seq=self.status_seq, state=state,
            collectors=[c.spec.name for c in running],
            failing={c.spec.name: (c.last_error or "")[:ERROR_MAX] for c in running if c.failing},
            unsupported={c.spec.name: c.reason or "not probed yet" for c in self.states.values() if not c.supported})
        self.status_seq += 1
        return status

    async def _publish_status(self, state: Literal["running", "stopping"] = "running") -> None:
        """Send one status; a failure is counted and logged, never raised: without status a working host would look
        like a silent one."""
        try:
            await self.publisher.send(AGENT, self.status(state))
        except Exception as exc:
            self.publish_errors += 1
            log.error("publish of the agent status to %s failed: %r", AGENT.name, exc)
        else:
            self.status_sent += 1

    def status_period_s(self) -> float:
        """`agent_status_every_s`; `agent_interval_s` while a collector fails or no GPU sample collector runs: then
        the status is the host's only sign of life, and the pipeline takes a host unheard of for a minute as silent."""
        s = self.settings
        sampling = any(c.supported and c.spec.gpu_samples and not c.failing for c in self.states.values())
        return s.agent_status_every_s if sampling else min(s.agent_interval_s, s.agent_status_every_s)

    async def _status_loop(self) -> None:
        """A status now, then every `status_period_s()`, and at once (within `status_min_gap_s`) when a collector
        starts or stops running or failing."""
        while True:
            self._status_due.clear()
            await self._publish_status()
            last = time.monotonic()
            try:
                await asyncio.wait_for(self._status_due.wait(), self.status_period_s())
            except TimeoutError:
                continue
            await asyncio.sleep(max(0.0, last + self.status_min_gap_s - time.monotonic()))

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, after_probe: Callable[[], None] | None = None) -> None:
        """Probe, poll and publish until `stop` is set; then say goodbye (a "stopping" status) and close every
        collector. The goodbye is handed to the publisher before this returns, so the caller's publisher.close()
        delivers it (or spools it, the broker being away) like any record."""
        await self.probe()
        if after_probe is not None:
            after_probe()
        status = asyncio.create_task(self._status_loop(), name="agent-status")
        self._start_loops()
        recheck = asyncio.create_task(self._recheck()) if self.settings.agent_recheck_s > 0 else None
        try:
            await stop.wait()
        finally:
            tasks = [t for t in [status, recheck, *(s.task for s in self.states.values())] if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if stop.is_set():  # an orderly stop, not a cancelled agent: the silence that follows is planned
                await self._publish_status("stopping")
            await self.close()

    async def once(self, after_probe: Callable[[], None] | None = None) -> dict[str, Any]:
        """Probe, poll each supported collector once, close: what `fleetpulse agent --once` prints, the status the
        agent would publish (under fleet.telemetry.agent) included."""
        await self.probe()
        if after_probe is not None:
            after_probe()
        report: dict[str, Any] = {"host": self.settings.agent_host, "collectors": {}}
        try:
            for name, state in self.states.items():
                entry: dict[str, Any] = {"supported": state.supported}
                if state.supported:
                    for topic, message in await self.poll(state):
                        report.setdefault(topic.name, []).append(message.model_dump(mode="json"))
                    entry.update(poll_s=round(state.last_poll_s, 6), error=state.last_error)
                else:
                    entry["reason"] = state.reason
                report["collectors"][name] = entry
            report[AGENT.name] = [self.status().model_dump(mode="json")]
        finally:
            await self.close()
        return report

    async def close(self) -> None:
        busy = [s.busy for s in self.states.values() if s.busy is not None and not s.busy.done()]
        if busy:  # a sample() still in its thread: let it finish before its collector is closed under it
            await asyncio.wait(busy)
        for state in self.states.values():
            if state.collector is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(state.collector.close)
                state.collector, state.supported, state.task = None, False, None
