"""Run one scenario through the real pipeline, faster than real time, and score it against its ground truth.

Pieces, all real: the Kafka broker (the configured cluster, or the local one started on demand), the stream worker
as a child process (`fleetpulse streams`, every stage), the ClickHouse sink in this process writing to a database of
its own, the simulator publishing ticks, and a simulated remediation bot answering drain events. Every run uses a
topic prefix and a database of its own, so runs never see each other's records.

Pace: the simulator publishes a tick as soon as the stream worker has less than `max_lag` records left to consume,
so simulated time runs as fast as the pipeline can follow and wall-clock latencies measure the pipeline, not a
backlog the simulator built.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.publisher import Publisher
from agents.simulator.simulate import FleetSimulator
from agents.simulator.scenario import Scenario
from fleetpulse import breaker_cli
from fleetpulse.broker import ensure_broker, local_broker
from fleetpulse.clickhouse_server import LocalClickHouse, ensure_clickhouse
from core.errors import FleetpulseError
from fleetpulse.evaluate import collect
from fleetpulse.evaluate.bot import SimulatedBotConfig, SimulatedBot
from core.kafka_admin import delete_prefixed
from schemas.provision import ensure_topics
from fleetpulse.lag import OffsetWatch
from core.settings import CommonSettings, load
from fleetpulse.stack import Child
from schemas.codec import decode
from schemas.tables import TABLE_BY_TOPIC
from schemas.topics import AGENT, DRAIN, HOST_EVENTS, NCCL, NET, REMEDIATION, SAMPLES, TOPICS, TRUTH, XID
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings


@dataclass
class Plan:
    """What to run: the scenario (overrides applied) and how."""

    scenario: Scenario
    hosts: int
    duration_s: float
    interval_s: float
    nccl_interval_s: float
    seed: int = 0
    max_lag: int | None = None  # records the worker may trail by; None = a quarter tick, at least 200
    kill_worker_at: float | None = None  # simulated seconds: SIGKILL the worker there and start a new one
    settle_s: float = 120.0  # longest wait for the worker and sink to finish after the last tick
    speed: float = 0.0  # at most this many simulated seconds per wall second; 0 = as fast as the worker follows
    keep_topics: bool = False  # the run's topics are deleted once scored (its database stays)
    keep_broker: bool = False  # a local broker this run started is stopped at its end, unless kept
    keep_store: bool = False  # the same for the local ClickHouse server
    streams_env: dict[str, str] = field(default_factory=dict)  # FLEETPULSE_* for the worker (rule parameters)
    bot: SimulatedBotConfig = field(default_factory=SimulatedBotConfig)

    def lag_limit(self, tick_records: int) -> int:
        """The next tick goes out once the worker is through most of the last one: its XID lines then meet a
        nearly idle pipeline, as they would at a real fleet's pace, and latencies measure hops, not a queue."""
        return self.max_lag if self.max_lag is not None else max(200, tick_records // 4)


class Progress:
    """One status line on stderr every few seconds while the run goes."""

    def __init__(self, every_s: float = 5.0, quiet: bool = False):
        self.every_s, self.quiet, self._last = every_s, quiet, 0.0

    def say(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not self.quiet and (force or now - self._last >= self.every_s):
            self._last = now
            print(f"evaluate: {text}", file=sys.stderr, flush=True)


class Evaluation:
    """One run: start the parts, publish the scenario, let the pipeline settle, stop, collect and score."""

    def __init__(self, settings: CommonSettings, plan: Plan, *, progress: Progress | None = None):
        self.plan = plan
        self.tag = f"{plan.scenario.name.replace('-', '_').replace('.', '_')}_{secrets.token_hex(3)}"
        self.settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}eval-{self.tag}."})
        self.database = f"eval_{self.tag}"
        self.progress = progress or Progress()
        self.bot = SimulatedBot(plan.bot)
        self.worker: Child | None = None
        self.restarts = 0
        self.logs = settings.data_dir / "evaluate" / self.tag
        self.timings: dict[str, float] = {}

    def _worker_env(self) -> dict[str, str]:
        budgets = self.plan.scenario.fleet.rack_budgets_w
        env = {**os.environ, "FLEETPULSE_TOPIC_PREFIX": self.settings.topic_prefix,
               "FLEETPULSE_DATA_DIR": str(self.logs / "worker"), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
               "FLEETPULSE_STREAMS_COMMIT_INTERVAL_S": "0.5",  # lag seen by the pacing is at most this stale
               # one telemetry process unless set: the run shares this machine's cores with the simulator, the
               # broker, the sink and the store, which a deployment's workers do not
               "FLEETPULSE_STREAMS_TELEMETRY_PROCESSES": os.environ.get("FLEETPULSE_STREAMS_TELEMETRY_PROCESSES", "1"),
               **self.plan.streams_env}
        if budgets:
            env["FLEETPULSE_RACK_BUDGETS_W"] = json.dumps(budgets)
        return env

    async def _start_worker(self) -> None:
        self.worker = Child("streams", ["streams"], self.logs / "streams.log", env=self._worker_env())
        await self.worker.start()

    async def run(self) -> dict:
        """The run, with the local broker and ClickHouse server started for it (when none ran) stopped at its end, or
        said to be left running."""
        s = self.settings
        local = local_broker(s) if s.uses_local_kafka else None
        started = local is not None and not (await asyncio.to_thread(local.status))["running"]
        server = LocalClickHouse.of(s) if s.uses_local_clickhouse else None
        started_server = server is not None and not server.running
        try:
            await asyncio.to_thread(ensure_clickhouse, s)
            return await self._run()
        finally:
            if started and self.plan.keep_broker:
                self.progress.say(f"left the local Kafka broker this run started running ({local.bootstrap}); stop it "
                                  "with `fleetpulse kafka stop`", force=True)
            elif started:
                await asyncio.to_thread(local.stop)
                self.progress.say("stopped the local Kafka broker this run started", force=True)
            if started_server and self.plan.keep_store:
                self.progress.say(f"left the local ClickHouse server this run started running ({server.url}); stop "
                                  "it with `fleetpulse clickhouse stop`", force=True)
            elif started_server:
                await asyncio.to_thread(server.stop)
                self.progress.say("stopped the local ClickHouse server this run started; its rows stay "
                                  "(`fleetpulse clickhouse start` serves them again)", force=True)

    async def _run(self) -> dict:
        p, s = self.plan, self.settings
        wall0 = time.monotonic()
        await asyncio.to_thread(ensure_broker, s)
        await ensure_topics(s.kafka_client_args(), prefix=s.topic_prefix, replication=s.replication)
        sink_settings = load(SinkSettings, **{**s.model_dump(include=set(CommonSettings.model_fields)),
                                              "clickhouse_database": self.database, "sink_http": False,
                                              "rack_budgets_w": p.scenario.fleet.rack_budgets_w,
                                              "sink_batch_max_seconds": 0.5, "sink_periodic_batch_max_seconds": 0.5})
        sink = ClickHouseSink(sink_settings)
        stop_sink = asyncio.Event()
        sink_task = asyncio.create_task(run_sink(sink, stop_sink))
        await self._start_worker()
        from streams.groups import worker_groups

        stream_inputs = worker_groups(s.topic_prefix)  # per stream worker: its group and the topics it reads
        watch = OffsetWatch(s.kafka_client_args(), {t.full(s.topic_prefix): t.partitions for t in TOPICS.values()})
        await watch.start()
        drains = asyncio.create_task(self._follow_drains())
        self.progress.say(f"run {self.tag}: {p.hosts} hosts, {p.duration_s:g} s simulated at {p.interval_s:g} s "
                          f"ticks; topics {s.topic_prefix}*, database {self.database}; logs {self.logs}", force=True)
        try:
            sim = await self._publish(watch, stream_inputs)
            self.timings["publish_wall_s"] = round(time.monotonic() - wall0, 1)
            await self._settle(watch, stream_inputs, sink_settings.sink_group_id, sim["end_ts"])
        finally:
            drains.cancel()
            if self.worker is not None:
                self.timings["worker_exit"] = await self.worker.stop()
            stop_sink.set()
            await asyncio.wait_for(sink_task, 120)
            await watch.close()
        self.timings["total_wall_s"] = round(time.monotonic() - wall0, 1)
        rows = await asyncio.to_thread(collect.rows, sink_settings)
        if not p.keep_topics:
            deleted = await delete_prefixed(s.kafka_client_args(), s.topic_prefix)
            self.progress.say(f"deleted the run's {len(deleted)} topics; its rows stay in {self.database}", force=True)
        return collect.report(self, sim, rows, sink)

    async def _publish(self, watch: OffsetWatch, stream_inputs: list[tuple[str, list[str]]]) -> dict:
        """Publish every tick (with the bot's answers that came due) as fast as the worker follows."""
        p, s = self.plan, self.settings
        sim = FleetSimulator(p.hosts, seed=p.seed, scenario=p.scenario, interval=p.interval_s,
                             nccl_interval=p.nccl_interval_s, start_ts=float(int(time.time())))
        self.bot.checkpoint_after = sim.checkpoint_after
        ticks = max(1, round(p.duration_s / p.interval_s))
        stats = {"start_ts": sim.start_ts, "ticks": 0, "truth": [], "gpu_readings": 0, "nccl_timings": 0, "net_ports": 0,
                 "max_lag": 0, "lag_waits_s": 0.0, "run_id": sim.run_id, "fleet_gpus": sim.fleet.n_gpus,
                 "jobs": {job.name: job for job in sim.fleet.jobs}}
        wall0 = time.monotonic()
        async with Publisher(s, client_id=f"fleetpulse-evaluate-{self.tag}") as pub:
            for k in range(ticks):
                tick = sim.step()
                if p.kill_worker_at is not None and self.restarts == 0 and tick.ts - sim.start_ts >= p.kill_worker_at:
                    await self._kill_worker(pub)
                if p.speed > 0:  # a real fleet's pace (speed 1) or a multiple of it: each record at its own time
                    await self._paced(pub, tick, wall0, sim.start_ts)
                else:  # flat out: the tick's injections and kernel lines go out just before its samples
                    await pub.send_many(TRUTH, tick.truth)
                    await pub.send_many(XID, tick.xid)
                    await pub.send_many(HOST_EVENTS, tick.host_events)
                await pub.send_many(AGENT, tick.agent)
                await pub.send_many(SAMPLES, tick.samples)
                await pub.send_many(NET, tick.net)
                await pub.send_many(NCCL, tick.nccl)
                for result in self.bot.due(tick.ts):
                    await pub.send(REMEDIATION, result)
                    if result.ok and result.action in ("repair", "replace"):
                        sim.repaired(result.host, result.action)
                await pub.flush()
                stats["ticks"] += 1
                stats["truth"] += tick.truth
                stats["gpu_readings"] += sum(len(x["gpus"]) for x in tick.samples)
                stats["nccl_timings"] += sum(len(x["ranks"]) for x in tick.nccl)
                stats["net_ports"] += sum(len(x["ports"]) for x in tick.net)
                stats["end_ts"] = tick.ts
                stats["lag_limit"] = p.lag_limit(len(tick.samples) + len(tick.xid) + len(tick.nccl) + len(tick.agent)
                                                 + len(tick.net) + len(tick.host_events))
                lag = await self._hold(watch, stream_inputs, stats)
                self.progress.say(f"t={tick.ts - sim.start_ts:.0f}/{p.duration_s:g} s simulated, "
                                  f"{len(stats['truth'])} faults injected, worker {lag} records behind, "
                                  f"{self.bot.waiting} bot answers pending")
            stats["sent"] = dict(pub.sent)
        return stats

    async def _paced(self, pub: Publisher, tick, wall0: float, start_ts: float) -> None:
        """Publish the tick's injections and XID lines when their simulated time comes, then wait for the tick.

        A kernel logs an XID (or a NIC or disk line) the moment it happens, between two samples, not with them;
        publishing it at its own time lets XID -> drain latency meet the pipeline as a real fleet's would, idle or
        mid-burst by chance."""
        due = lambda ts: wall0 + (ts - start_ts) / self.plan.speed  # noqa: E731
        lines = [(TRUTH, t) for t in tick.truth] + [(XID, x) for x in tick.xid]
        for topic, rec in sorted(lines + [(HOST_EVENTS, e) for e in tick.host_events], key=lambda e: e[1]["ts"]):
            await asyncio.sleep(max(0.0, due(rec["ts"]) - time.monotonic()))
            await pub.send(topic, rec)
            await pub.flush()
        await asyncio.sleep(max(0.0, due(tick.ts) - time.monotonic()))

    async def _hold(self, watch: OffsetWatch, stream_inputs: list[tuple[str, list[str]]], stats: dict) -> int | None:
        """Wait while the worker trails by more than the lag limit (or has not joined yet); at most 120 s."""
        began = time.monotonic()
        while True:
            lag = await watch.groups_lag(stream_inputs)
            if lag is not None:
                stats["max_lag"] = max(stats["max_lag"], lag)
            if lag is not None and lag <= stats["lag_limit"]:
                break
            if not self.worker.running:
                raise FleetpulseError(f"the stream worker exited ({self.worker.proc.returncode}); see {self.logs}")
            if time.monotonic() - began > 120:
                self.progress.say(f"worker still {lag} records behind after 120 s; publishing on", force=True)
                break
            await asyncio.sleep(0.2)
        stats["lag_waits_s"] += time.monotonic() - began
        return lag

    async def _kill_worker(self, pub: Publisher) -> None:
        """Kill -9 mid-scenario (no clean shutdown, no final commit) and start a fresh worker on the same group."""
        await pub.flush()
        self.worker.proc.send_signal(signal.SIGKILL)
        await self.worker.wait()
        self.restarts += 1
        self.progress.say("stream worker killed (SIGKILL); starting a new one", force=True)
        await self._start_worker()

    async def _follow_drains(self) -> None:
        """Feed every drain event to the simulated bot (the bot answers on simulated time, in _publish)."""
        consumer = AIOKafkaConsumer(**self.settings.kafka_client_args(), enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            topic = DRAIN.full(self.settings.topic_prefix)
            consumer.assign([TopicPartition(topic, i) for i in range(DRAIN.partitions)])
            async for record in consumer:
                self.bot.receive(decode(record.value))
        finally:
            await consumer.stop()

    async def _settle(self, watch: OffsetWatch, stream_inputs: list[tuple[str, list[str]]], sink_group: str,
                      last_ts: float) -> None:
        """After the last tick: the worker consumes everything, the fleet step is told the fleet's clock stopped at
        `last_ts` (it reports the last minute, as `up` has it at its end), its outputs go quiet, the sink stores all
        of it."""
        s, deadline = self.settings, time.monotonic() + self.plan.settle_s
        outputs = [t.full(s.topic_prefix) for t in TOPICS.values()]
        quiet_since, last_ends, closed = time.monotonic(), None, False
        while time.monotonic() < deadline:
            lag = await watch.groups_lag(stream_inputs)
            ends = {tp.topic: o for tp, o in (await watch.end_offsets()).items() if tp.topic in outputs}
            if ends != last_ends:
                quiet_since, last_ends = time.monotonic(), ends
            self.progress.say(f"settling: worker {lag} records behind, outputs quiet for "
                              f"{time.monotonic() - quiet_since:.0f} s")
            if lag == 0 and not closed:
                try:
                    await breaker_cli.close_minutes(s, last_ts)
                except FleetpulseError as exc:  # no lifecycle stage in this run
                    self.progress.say(f"the last usable-compute minute stays open: {exc}", force=True)
                closed, quiet_since = True, time.monotonic()
            elif lag == 0 and time.monotonic() - quiet_since >= 5.0:
                break
            await asyncio.sleep(0.5)
        else:
            self.progress.say(f"worker did not settle within {self.plan.settle_s:g} s; scoring what arrived",
                              force=True)
        sink_topics = [tb.topic.full(s.topic_prefix) for tb in TABLE_BY_TOPIC.values()]
        group = s.topic_prefix + sink_group
        deadline = time.monotonic() + self.plan.settle_s
        while time.monotonic() < deadline:
            lag = await watch.group_lag(group, sink_topics)
            self.progress.say(f"settling: sink {lag} records behind")
            if lag == 0:
                return
            await asyncio.sleep(0.5)
        raise FleetpulseError(f"the sink did not store everything within {self.plan.settle_s:g} s")


def write_report(report: dict, path: Path | None) -> None:
    text = json.dumps(report, indent=2, default=str)
    if path is not None:
        path.write_text(text + "\n")
    print(text)

