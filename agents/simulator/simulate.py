"""FleetSimulator (pure, one tick at a time) and `simulate`, which publishes its ticks to Kafka in real or fast time."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, Field

from agents.publisher import Publisher
from agents.simulator.faults import FaultInjector
from agents.simulator.fleet import build_fleet
from agents.simulator.generate import expand
from agents.simulator.gpu_state import GpuState
from agents.simulator.nccl import NcclModel
from agents.simulator.network import NET_EVERY_S, NetState
from agents.simulator.samples import host_samples
from agents.simulator.scenario import Scenario, load_scenario
from agents.simulator.status import STATUS_EVERY_S, AgentStatuses
from core.errors import BrokerError, ConfigError, DecodeError
from schemas.provision import ensure_topics
from core.settings import CommonSettings
from schemas.analytics import InjectedFault
from schemas.events import timings_of
from schemas.codec import decode
from schemas.topics import AGENT, HOST_EVENTS, NCCL, NET, REMEDIATION, SAMPLES, TRUTH, XID


@dataclass
class Tick:
    """Everything one interval produces: a sample per host, and the XID, NCCL, agent status and truth records due
    in it."""

    index: int
    ts: float
    samples: list[dict]
    xid: list[dict] = field(default_factory=list)
    nccl: list[dict] = field(default_factory=list)  # NcclStep dicts: one per host and collective
    truth: list[dict] = field(default_factory=list)
    agent: list[dict] = field(default_factory=list)  # AgentStatus dicts of the hosts whose agent speaks now
    net: list[dict] = field(default_factory=list)  # NetSample dicts, on the ticks the port collector runs
    host_events: list[dict] = field(default_factory=list)  # HostEvent dicts (NIC, disk lines) due in this tick

    @property
    def timings(self) -> list[dict]:
        """The NCCL steps as per-rank NcclTiming dicts."""
        return rank_timings(self.nccl)


def rank_timings(steps: list[dict]) -> list[dict]:
    """NCCL step dicts as per-rank NcclTiming dicts."""
    return [t for step in steps for t in timings_of(step)]


class FleetSimulator:
    """A seeded, deterministic fleet: `step()` builds the next tick without touching Kafka.

    Streams of randomness are split per concern, so e.g. changing the NCCL cadence leaves the telemetry as it was.
    `nccl_interval` is the simulated seconds between one rank's collective records (0 = no NCCL records);
    `status_interval` between one host agent's periodic status records (0 = no status records; agents/simulator/
    status.py: one at start, on every change, every tick while a collector fails, a goodbye on an orderly stop);
    `net_interval` between one host's port samples (NetSample, agents/simulator/network.py; 0 = none).
    The scenario's fleet block lays out the jobs and racks, and gives the host count when `hosts` is None; its
    generate blocks are drawn here, from `seed`, so `self.scenario` holds every fault the run injects.
    """

    def __init__(self, hosts: int | None = None, *, seed: int = 0,
                 scenario: str | Path | dict | Scenario | None = None, interval: float = 1.0,
                 start_ts: float | None = None, cluster: str = "sim", gpu_model: str = "H100",
                 nccl_interval: float = 1.0, run_id: str | None = None, status_interval: float = STATUS_EVERY_S,
                 net_interval: float = NET_EVERY_S):
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if nccl_interval < 0:
            raise ValueError("nccl_interval must be >= 0")
        if status_interval < 0:
            raise ValueError("status_interval must be >= 0")
        if net_interval < 0:
            raise ValueError("net_interval must be >= 0")
        scenario = load_scenario(scenario)
        hosts = scenario.plan(hosts=hosts).hosts
        self.seed, self.interval, self.nccl_interval = seed, interval, nccl_interval
        self.start_ts = time.time() if start_ts is None else start_ts
        layout = scenario.fleet
        try:
            self.fleet = build_fleet(hosts, seed=seed, cluster=cluster, gpu_model=gpu_model,
                                     hosts_per_rack=layout.hosts_per_rack, jobs=layout.jobs,
                                     domain_hosts=layout.nvlink_domain_hosts, checkpoint_s=layout.checkpoint_s)
        except ValueError as exc:
            raise ConfigError(f"scenario {scenario.name}: fleet.jobs: {exc}") from None
        self.scenario = expand(scenario, self.fleet, seed)
        self.run_id = run_id or self._run_id(hosts)
        telemetry_rng, nccl_rng, fault_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
        self.state = GpuState(self.fleet, telemetry_rng)
        self.nccl = NcclModel(self.fleet, nccl_rng)
        self.faults = FaultInjector(self.fleet, self.scenario, self.state, fault_rng,
                                    run_id=self.run_id, start_ts=self.start_ts, nccl=nccl_interval > 0,
                                    interval=interval)
        self.statuses = AgentStatuses(self.fleet, status_interval) if status_interval > 0 else None
        self.net = NetState(self.fleet)
        self.net_interval, self._next_net = net_interval, 0.0
        self.host_index = {h: i for i, h in enumerate(self.fleet.hosts)}
        self.index = 0
        self._next_collective = 0  # index of the next collective step (at nccl_interval * index)

    def _run_id(self, hosts: int) -> str:
        digest = hashlib.blake2b(f"{self.seed}/{hosts}/{self.scenario.name}/{self.start_ts}".encode(), digest_size=4)
        return f"sim-{self.scenario.name}-{digest.hexdigest()}"

    def step(self) -> Tick:
        k, dt = self.index, self.interval
        t_now = k * dt
        ts = self.start_ts + t_now
        effects, xid_events, truth = self.faults.apply(t_now - dt, t_now)
        self.state.advance(dt, ts, effects)
        if not effects.host_up.all():  # a host that is down logs nothing anyone reads
            xid_events = [e for e in xid_events if effects.host_up[self.host_index[e["host"]]]]
        tick = Tick(k, ts, host_samples(self.fleet, self.state, ts=ts, seq=k), xid_events, [], truth)
        if self.statuses is not None:
            tick.agent = self.statuses.records(t_now, ts, effects)
        for h in self.faults.take_rebooted():
            self.net.rebooted(h)
        self.net.advance(dt, effects.port_down, effects.port_rate, effects.port_drops, effects.port_errors)
        tick.host_events = [e for e in self.faults.take_host_lines(ts) if effects.host_up[self.host_index[e["host"]]]]
        if self.net_interval > 0 and t_now >= self._next_net - 1e-9:
            tick.net = self.net.samples(ts=ts, seq=int(self._next_net // self.net_interval), up=effects.host_up)
            self._next_net += self.net_interval * (np.floor((t_now - self._next_net) / self.net_interval) + 1)
        if self.nccl_interval > 0:
            slowdown = self.state.step_time_factor() * effects.compute_factor
            running = self.state.active & ~effects.nccl_stopped
            while self._next_collective * self.nccl_interval < t_now + dt - 1e-9:
                step_ts = self.start_ts + self._next_collective * self.nccl_interval
                tick.nccl.extend(self.nccl.records(step_ts, slowdown, running, effects.transfer_factor))
                self._next_collective += 1
        self.index += 1
        return tick

    def repaired(self, host: str, action: str) -> None:
        """A remediation bot finished a repair (or replacement) of `host`: its GPUs show it from the next tick on, and
        a host that was down for good is back (its agent starts: a running status at once)."""
        h = self.host_index[host]
        self.state.repaired(h, replaced=action == "replace")
        self.faults.repaired(h)

    def checkpoint_after(self, host: str, ts: float) -> float | None:
        """When the job on `host` next saves a checkpoint at or after epoch `ts` (None: the host runs no job)."""
        j = int(self.fleet.host_job[self.host_index[host]]) if host in self.host_index else -1
        return None if j < 0 else self.start_ts + self.fleet.jobs[j].checkpoint_after(ts - self.start_ts)


def build_tick(hosts: int, *, seed: int = 0, ts: float = 1_700_000_000.0, **kwargs) -> Tick:
    """The first tick of a fresh fleet, without Kafka (unit tests, benchmarks)."""
    return FleetSimulator(hosts, seed=seed, start_ts=ts, **kwargs).step()


class SimulationReport(BaseModel):
    """What a run published, per topic, and the ground truth of what it injected."""

    run_id: str
    scenario: str
    seed: int
    hosts: int
    gpus: int
    interval: float
    ticks: int
    start_ts: float
    end_ts: float = Field(description="timestamp of the last tick published")
    wall_s: float
    stopped_early: bool = False
    topic_prefix: str = ""
    sent: dict[str, int] = Field(description="records delivered per registry topic name")
    gpu_readings: int = Field(description="GPU rows inside the samples (hosts*8 per tick, less lost GPUs)")
    nccl_timings: int = Field(default=0, description="rank timings inside the NCCL step records (nccl_timings rows)")
    net_ports: int = Field(default=0, description="port readings inside the NetSamples (net_ports rows)")
    truth: list[InjectedFault]


def _aligned_start(interval: float) -> float:
    """The next wall-clock multiple of `interval`, so samples land on round seconds like a real collector's."""
    return math.ceil(time.time() / interval) * interval


async def simulate(settings: CommonSettings, *, hosts: int | None = None, duration: float | None = None,
                   seed: int | None = None, scenario: str | Path | dict | Scenario | None = None, speed: float = 1.0,
                   start_ts: float | None = None, interval: float | None = None, stop: asyncio.Event | None = None,
                   nccl_interval: float | None = None, cluster: str = "sim",
                   on_tick: Callable[[Tick, Publisher], None] | None = None,
                   per_rank_nccl: bool = False, follow_repairs: bool = False) -> SimulationReport:
    """Publish round(duration / interval) ticks: one HostSample per host per tick, plus XID, NCCL, agent status and
    truth records.

    NCCL goes out as one NcclStep per host and collective; per_rank_nccl publishes the older one-record-per-rank
    NcclTiming form instead (what agents before it sent, and what an older worker reads: bench --baseline).
    speed 1 paces ticks on the wall clock; speed N runs N times faster; speed 0 runs as fast as possible.
    Timestamps advance by `interval` per tick from `start_ts` (default: now, aligned to the interval).
    Arguments left None come from the scenario's fleet and run blocks, then from RUN_DEFAULTS.
    follow_repairs: a remediation bot's successful repairs and replacements (fleet.remediation.results, from the
    run's start on) mend the simulated hosts, as the evaluation's bot does, so a repaired GPU stops showing its fault.
    """
    if speed < 0:
        raise ValueError("speed must be >= 0")
    scenario = load_scenario(scenario)
    plan = scenario.plan(hosts=hosts, duration_s=duration, interval_s=interval, nccl_interval_s=nccl_interval,
                         seed=seed)
    hosts, seed, interval = plan.hosts, plan.seed, plan.interval_s
    ticks = max(0, round(plan.duration_s / interval))
    aligned = start_ts is None and speed == 1.0
    sim = FleetSimulator(hosts, seed=seed, scenario=scenario, interval=interval, cluster=cluster,
                         start_ts=_aligned_start(interval) if aligned else start_ts,
                         nccl_interval=plan.nccl_interval_s)
    try:
        await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix,
                            replication=settings.replication)
    except KafkaError as exc:
        raise BrokerError(f"cannot create the topics on {settings.bootstrap}: {exc!r}") from exc
    truth: list[dict] = []
    gpu_readings = nccl_timings = net_ports = 0
    wall0 = time.monotonic()
    done = 0
    repairs = RepairFeed(settings) if follow_repairs else None

    def due(ticks: float) -> float:
        """Seconds until `ticks` intervals into the run (on the wall clock's interval grid when aligned)."""
        if aligned:
            return sim.start_ts + ticks * interval - time.time()
        return ticks * interval / speed - (time.monotonic() - wall0)

    if repairs is not None:
        await repairs.start()
    try:
        async with Publisher(settings, client_id=f"fleetpulse-simulator-{sim.run_id}") as pub:
            for k in range(ticks):
                if stop is not None and stop.is_set():
                    break
                for host, action in repairs.take() if repairs is not None else ():
                    if host in sim.fleet.hosts:
                        sim.repaired(host, action)
                if speed > 0:
                    await _sleep_or_stop(due(k), stop)
                    if stop is not None and stop.is_set():
                        break
                tick = sim.step()
                await pub.send_many(TRUTH, tick.truth)
                await pub.send_many(XID, tick.xid)
                await pub.send_many(HOST_EVENTS, tick.host_events)
                await pub.send_many(NET, tick.net)
                await pub.send_many(AGENT, tick.agent)
                for phase, samples, nccl in _phases(sim, tick, plan.phases if speed > 0 else 1):
                    if phase:  # a stop cuts the wait, not the tick: what was counted is what was sent
                        await _sleep_or_stop(due(k + phase / plan.phases), stop)
                    await pub.send_many(SAMPLES, samples)
                    await pub.send_many(NCCL, rank_timings(nccl) if per_rank_nccl else nccl)
                    if speed > 0:
                        await pub.flush()
                truth.extend(tick.truth)
                gpu_readings += sum(len(s["gpus"]) for s in tick.samples)
                nccl_timings += sum(len(n["ranks"]) for n in tick.nccl)
                net_ports += sum(len(n["ports"]) for n in tick.net)
                if speed == 0:
                    await asyncio.sleep(0)
                done += 1
                if on_tick is not None:
                    on_tick(tick, pub)
            await pub.flush()
            sent = {t.name: pub.sent.get(t.name, 0) for t in (SAMPLES, XID, NCCL, AGENT, NET, HOST_EVENTS, TRUTH)}
    finally:
        if repairs is not None:
            await repairs.stop()
    return SimulationReport(
        run_id=sim.run_id, scenario=sim.scenario.name, seed=seed, hosts=hosts, gpus=sim.fleet.n_gpus,
        interval=interval, ticks=done, start_ts=sim.start_ts, end_ts=sim.start_ts + max(done - 1, 0) * interval,
        wall_s=round(time.monotonic() - wall0, 3), stopped_early=done < ticks, topic_prefix=settings.topic_prefix,
        sent=sent, gpu_readings=gpu_readings, nccl_timings=nccl_timings, net_ports=net_ports,
        truth=[InjectedFault.model_validate(t) for t in truth],
    )


class RepairFeed:
    """Successful repairs and replacements a remediation bot reports on fleet.remediation.results, from now on."""

    def __init__(self, settings: CommonSettings):
        self.settings = settings
        self.done: list[tuple[str, str]] = []
        self.consumer: AIOKafkaConsumer | None = None
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        topic = REMEDIATION.full(self.settings.topic_prefix)
        self.consumer = AIOKafkaConsumer(**self.settings.kafka_client_args(), enable_auto_commit=False)
        await self.consumer.start()
        self.consumer.assign([TopicPartition(topic, p) for p in range(REMEDIATION.partitions)])
        await self.consumer.seek_to_end()
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for record in self.consumer:
            try:
                result = decode(record.value)
            except DecodeError:
                continue  # the sink dead-letters it; the simulator only looks for repairs
            if type(result) is dict and result.get("ok") is True and result.get("action") in ("repair", "replace"):
                self.done.append((str(result.get("host")), str(result["action"])))

    def take(self) -> list[tuple[str, str]]:
        out, self.done = self.done, []
        return out

    async def stop(self) -> None:
        """Stop following; a feed that died on its own (the broker gone) took only the repairs with it."""
        try:
            if self.task is not None:
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.task
        finally:
            if self.consumer is not None:
                await self.consumer.stop()


def _phases(sim: FleetSimulator, tick: Tick, phases: int) -> list[tuple[int, list[dict], list[dict]]]:
    """A tick's samples and NCCL steps by the moment of the interval their host reports at: host i at phase i mod
    `phases`, each sample stamped with its phase's time (a collective keeps its own time: the agent reports it late)."""
    if phases == 1:
        return [(0, tick.samples, tick.nccl)]
    out = [(p, [], []) for p in range(phases)]
    for sample in tick.samples:
        p = sim.host_index[sample["host"]] % phases
        sample["ts"] = tick.ts + p * sim.interval / phases
        out[p][1].append(sample)
    for step in tick.nccl:
        out[sim.host_index[step["host"]] % phases][2].append(step)
    return out


async def _sleep_or_stop(delay: float, stop: asyncio.Event | None) -> None:
    if delay <= 0:
        return
    if stop is None:
        await asyncio.sleep(delay)
        return
    try:
        await asyncio.wait_for(stop.wait(), timeout=delay)
    except TimeoutError:
        pass
