"""`fleetpulse up`: broker, simulator, streams and sink as child processes, a simulated remediation bot, a live view,
and a clean stop. By default the simulator plays the `demo` scenario (a thermal runaway, an XID that needs a reset, a
straggler), so alerts, faults, a drain and a return happen while it runs; `--scenario baseline` is a quiet fleet."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import KafkaError

from fleetpulse import breaker_cli, page, report
from fleetpulse.broker import ensure_broker, local_broker
from fleetpulse.clickhouse_server import LocalClickHouse, ensure_clickhouse
from fleetpulse.run_data import start_fresh, where_it_lives
from core.errors import FleetpulseError
from agents.simulator.scenario import load_scenario
from fleetpulse.evaluate.bot import bot_config
from fleetpulse.stack_bot import answer_drains
from schemas.provision import ensure_topics
from fleetpulse.lag import OffsetWatch, per_topic, stable_members
from core.settings import CommonSettings, load
from fleetpulse.stack_view import StackView, fetch_store_facts
from schemas.topics import TOPICS
from schemas.tables import TABLE_BY_TOPIC
from sinks.settings import SinkSettings

STORE_EVERY_S = 5.0  # the live view's figures from the store: a query of every table, not free at scale
JOIN_WAIT_S = 120.0  # longest wait for the consumers to join their groups before the fleet starts


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=100, help="simulated hosts (8 GPUs each)")
    p.add_argument("--duration", type=float, default=None,
                   help="simulated seconds (default: the scenario's, demo 180 s); 0 = until Ctrl-C")
    p.add_argument("--seed", type=int, default=0, help="random seed of the simulated fleet (equal seeds, equal runs)")
    p.add_argument("--scenario", default="demo",
                   help="scenario name or file: the faults to inject and the bot's delays (default %(default)s; "
                        "baseline = nothing happens)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second (0 = flat out)")
    p.add_argument("--no-streams", action="store_true", help="skip the stream worker")
    p.add_argument("--plain", action="store_true", help="print status lines instead of the live view")
    p.add_argument("--drain-timeout", type=float, default=120, help="seconds to wait for consumers to catch up")
    p.add_argument("--keep", action="store_true",
                   help="go on with the last run's data (default: a fresh run; the last one's broker data, rows and "
                        "logs are removed first, while the project's own broker and server are stopped)")
    p.add_argument("--json", action="store_true",
                   help="print the whole result as JSON on stdout (default: a summary of a screen; the JSON goes to "
                        "<data_dir>/up.json)")
    p.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                   help="at the end of the run, load the fleet page in headless Chromium and write its screenshot")


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None  # None = this process's environment
    proc: asyncio.subprocess.Process | None = None
    stdout: bytes = b""
    exited: asyncio.Task | None = None  # the one reader of the child's stdout, shared by every waiter

    async def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # A session of its own: Ctrl-C reaches `up` alone, which then stops the children in order.
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetpulse.cli", *self.argv,
            stdout=asyncio.subprocess.PIPE, stderr=self.log.open("ab"), start_new_session=True, env=self.env,
        )
        self.exited = asyncio.create_task(self._collect())

    async def _collect(self) -> int:
        self.stdout, _ = await self.proc.communicate()
        return self.proc.returncode

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    async def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.wait(), timeout)
        except asyncio.TimeoutError:
            self.proc.kill()
            return await self.wait()


@dataclass
class Stack:
    settings: CommonSettings
    args: argparse.Namespace
    children: dict[str, Child] = field(default_factory=dict)
    started_broker: bool = False
    started_store: bool = False
    _facts: dict = field(default_factory=dict)
    _facts_at: float = float("-inf")

    def _child(self, name: str, *argv: str) -> Child:
        child = Child(name, list(argv), self.settings.data_dir / "logs" / f"{name}.log")
        self.children[name] = child
        return child

    async def run(self) -> dict:
        s, a = self.settings, self.args
        shot = None
        delays = bot_config(load_scenario(a.scenario).bot)  # a bad scenario stops `up` before anything starts
        print(f"up: {start_fresh(s, a.keep)}", file=sys.stderr)
        page_url = page_runner = bot = watch = figures = None
        bot_stop = asyncio.Event()
        view = StackView(plain=a.plain or not sys.stdout.isatty(), hosts=a.hosts)
        try:  # from the first thing started: whatever fails, everything started is stopped
            if s.uses_local_kafka:
                self.started_broker = not local_broker(s).status()["running"]
            await asyncio.to_thread(ensure_broker, s)
            if s.uses_local_clickhouse:
                self.started_store = not LocalClickHouse.of(s).running
            store_url = await asyncio.to_thread(ensure_clickhouse, s)
            if store_url:
                print(f"up: the store is the ClickHouse server on {store_url} "
                      f"({'started for this run' if self.started_store else 'already running'})", file=sys.stderr)
            # the live view reads their offsets
            await ensure_topics(s.kafka_client_args(), prefix=s.topic_prefix, replication=s.replication)
            await self._child("sink", "sink").start()
            page_url, page_runner = await self._serve_page()
            if page_url:
                print(f"up: the fleet page is on {page_url}", file=sys.stderr, flush=True)
            if not a.no_streams:
                streams = self._child("streams", "streams")
                # one telemetry process unless set: everything else `up` runs shares these cores with it
                streams.env = {**os.environ, "FLEETPULSE_STREAMS_TELEMETRY_PROCESSES":
                               os.environ.get("FLEETPULSE_STREAMS_TELEMETRY_PROCESSES", "1")}
                await streams.start()
            await self._child("watch", "watch").start()  # every consumer group's lag: PipelineLagging
            offsets = OffsetWatch(s.kafka_client_args(), {t.full(s.topic_prefix): t.partitions for t in TOPICS.values()})
            await offsets.start()
            watch = offsets
            await self._consumers_joined(offsets)
            sim_args = ["simulate", "--hosts", str(a.hosts), "--seed", str(a.seed), "--speed", str(a.speed),
                        "--scenario", a.scenario, "--follow-repairs"]
            if a.duration is not None:
                sim_args += ["--duration", str(a.duration or 10**9)]
            bot = asyncio.create_task(answer_drains(s, delays, a.speed, bot_stop))
            simulator = self._child("simulate", *sim_args)
            await simulator.start()
            interrupted = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, interrupted.set)
            sim_done = asyncio.create_task(simulator.wait())
            with view:
                view.note("running — Ctrl-C stops everything cleanly"
                          + (f" — fleet page on {page_url}" if page_url else ""))
                while not (interrupted.is_set() or sim_done.done()):
                    await self._refresh(view, watch)
                    crashed = [c.name for c in self.children.values() if c.proc and c.proc.returncode not in (None, 0)]
                    if crashed:
                        raise FleetpulseError(f"{', '.join(crashed)} exited early; see {s.data_dir / 'logs'}")
                    if bot.done():
                        raise FleetpulseError(f"the simulated remediation bot stopped: {bot.exception()!r}")
                    await asyncio.wait([sim_done], timeout=1.0)
                view.note("simulation finished" if sim_done.done() else "interrupted: stopping")
                await simulator.stop()
                await self._drain(view, watch, (_last_json(simulator.stdout) or {}).get("end_ts"))
                await self._refresh(view, watch, fresh=True)
                figures = await asyncio.to_thread(self._figures)
                if a.screenshot is not None and page_url:
                    view.note(f"taking the fleet page's screenshot: {a.screenshot}")
                    try:
                        shot = await page.screenshot(page_url, a.screenshot)
                    except Exception as exc:  # the run's own result still comes out
                        shot = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            if page_runner is not None:
                await page_runner.cleanup()
            bot_stop.set()
            answered = 0
            if bot is not None:
                done = (await asyncio.gather(bot, return_exceptions=True))[0]
                answered = done if isinstance(done, int) else 0
            for name in ("watch", "streams", "sink", "simulate"):
                if name in self.children:
                    await self.children[name].stop()
            if watch is not None:
                await watch.close()
            if self.started_broker:
                await asyncio.to_thread(local_broker(s).stop)
            if self.started_store and await asyncio.to_thread(LocalClickHouse.of(s).stop):
                print(f"up: stopped the ClickHouse server it started; its rows stay in {s.local_clickhouse_home} "
                      "(`fleetpulse clickhouse start` serves them again)", file=sys.stderr)
        report = _last_json(simulator.stdout)
        out = {"simulator": report, "bot_answers": answered, "page": page_url, "final": view.last,
               "outcomes": figures}
        if a.screenshot is not None:
            out["screenshot"] = {"path": str(a.screenshot), **shot} if shot else None
        return out

    async def _serve_page(self):
        """The fleet page on FLEETPULSE_PAGE_PORT; `up` runs on without it when the port is taken."""
        try:
            runner = await page.serve(self.settings, owner_only=True)
        except FleetpulseError as exc:
            print(f"up: {exc}; running without the fleet page", file=sys.stderr)
            return None, None
        return f"http://127.0.0.1:{self.settings.page_port}/", runner

    def _figures(self) -> dict | None:
        """The run's outcomes as `fleetpulse report` gives them right after it (the same queries and range)."""
        try:
            return report.build(self.settings, None, None)
        except FleetpulseError as exc:
            print(f"up: no figures for the run: {exc}", file=sys.stderr)
            return None

    async def _refresh(self, view: StackView, watch: OffsetWatch, fresh: bool = False) -> None:
        """The topics' offsets every call; the store's figures every STORE_EVERY_S (or `fresh`), as the view prints."""
        try:
            ends = per_topic(await watch.end_offsets())
        except KafkaError as exc:  # the broker slow or away: the view waits with it, `up` goes on
            view.note(f"cannot read the topics' offsets ({type(exc).__name__}); trying again")
            ends = (view.prev or (0.0, {}))[1]
        if fresh or time.monotonic() - self._facts_at >= STORE_EVERY_S:
            self._facts, self._facts_at = await fetch_store_facts(self.settings), time.monotonic()
        view.update(ends, self._facts)

    def _consumers(self) -> list[tuple[str, str, list[str]]]:
        """(child, consumer group, the topics it reads) of each consumer `up` runs: the stream workers', the sink's."""
        s = self.settings
        out = []
        if "streams" in self.children:
            from streams.groups import worker_groups

            out += [("streams", group, inputs) for group, inputs in worker_groups(s.topic_prefix)]
        out.append(("sink", s.topic_prefix + load(SinkSettings).sink_group_id,
                    [tb.topic.full(s.topic_prefix) for tb in TABLE_BY_TOPIC.values()]))
        return out

    async def _consumers_joined(self, watch: OffsetWatch) -> None:
        """Hold the fleet back until every consumer holds its partitions (at most JOIN_WAIT_S): what a fleet sends
        while the workers still import and join is a backlog they start with, `up`'s start rather than the pipeline
        falling behind (the groups were Stable 7.9 s after their start at 5,000 hosts)."""
        t0 = time.monotonic()
        waiting = self._consumers()
        while waiting and time.monotonic() - t0 < JOIN_WAIT_S:
            still = []
            for name, group, topics in waiting:
                try:
                    joined = await stable_members(watch.admin, group) > 0
                except KafkaError:  # the broker not answering for groups yet: asked again
                    joined = False
                if self.children[name].running and not joined:
                    still.append((name, group, topics))
            waiting = still
            if waiting:
                await asyncio.sleep(0.5)
        if waiting:
            print(f"up: {', '.join(g for _, g, _ in waiting)} not reading after {JOIN_WAIT_S:.0f} s; the fleet starts "
                  "anyway", file=sys.stderr, flush=True)
        else:
            print(f"up: every consumer reads ({time.monotonic() - t0:.1f} s); the fleet starts", file=sys.stderr,
                  flush=True)

    async def _drain(self, view: StackView, watch: OffsetWatch, last_ts: float | None) -> None:
        """Let streams, then the sink, consume everything already published before they are stopped.

        The sink must reach zero lag (raw data is never left behind). The stream worker gets a bounded
        wait: faust 0.15.3 can advance commits slowly after a rebalance, and a restarted worker resumes
        from its committed offsets anyway. Once the workers caught up, the fleet step is told the fleet's clock
        stopped at the last tick (`last_ts`), so it reports the run's last usable-compute minute now.
        """
        most = self.args.drain_timeout
        stages = [(name, group, topics, min(30.0, most) if name == "streams" else most)
                  for name, group, topics in self._consumers()]
        for k, (name, group, topics, budget) in enumerate(stages):
            deadline = time.monotonic() + budget
            while time.monotonic() < deadline and self.children[name].running:
                lag = await watch.group_lag(group, topics)
                view.note(f"waiting for {name} to catch up: {'?' if lag is None else lag} records behind")
                await self._refresh(view, watch)
                if lag == 0:
                    break
                await asyncio.sleep(1.0)
            if name == "streams" and stages[k + 1][0] != "streams":  # every worker caught up (or out of time)
                if last_ts is not None:
                    await self._close_minutes(view, last_ts)
                await self.children[name].stop()


    async def _close_minutes(self, view: StackView, last_ts: float) -> None:
        try:
            ts = await breaker_cli.close_minutes(self.settings, last_ts)
        except FleetpulseError as exc:
            view.note(f"the last usable-compute minute stays open: {exc}")
            return
        view.note(f"closed the last usable-compute minute (to {time.strftime('%H:%M:%S', time.gmtime(ts))} UTC)")


def _last_json(stdout: bytes) -> dict | None:
    """The simulator prints its report as one JSON document at the end."""
    try:
        return json.loads(stdout)
    except ValueError:
        return None


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    os.environ.setdefault("FLEETPULSE_DATA_DIR", str(settings.data_dir.resolve()))
    settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
    result = asyncio.run(Stack(settings, args).run())
    text = json.dumps(result, indent=2, default=str)
    if args.json:
        print(text)
        return 0
    (settings.data_dir / "up.json").write_text(text + "\n")
    print("\n".join(summary(result, args)))
    print(f"whole result: {settings.data_dir / 'up.json'}; {where_it_lives(settings)}")
    return 0


def summary(result: dict, args: argparse.Namespace) -> list[str]:
    """What the run did, in a dozen lines: published and stored, its outcomes as `fleetpulse report` gives them, the
    newest events."""
    sim, final = result.get("simulator") or {}, result.get("final") or {}
    rows = final.get("rows") or {}
    out = [f"fleetpulse up: {sim.get('scenario', args.scenario)}, {args.hosts} hosts, {sim.get('ticks', '?')} ticks "
           f"published ({sim.get('gpu_readings', 0):,} GPU readings); {rows.get('gpu_samples', 0):,} GPU rows stored"]
    if (got := result.get("outcomes")) is not None:
        u, d, st = got["usable_compute"], got["drains"], got["stragglers"]
        out += [f"usable compute {report.percent(u['gpu_weighted'])} over {u['minutes']} minutes · interruptions "
                f"{got['interruptions']['total']} · drains {d['requested']} · returned {d['returned']} · "
                f"straggler job-seconds lost {st['job_seconds_lost']} · pages {got['alerts']['pages']}",
                *(f"note: {n}" for n in got["notes"])]
    out += [f"alerts firing at the end {final.get('alerts_firing') or 0} · bot answers {result.get('bot_answers', 0)} "
            f"· store: {final.get('store') or '-'} · dead letters {final.get('dead_letters', 0)}"]
    events = final.get("events") or []
    if events:
        out += ["newest events:"] + [f"  {e}" for e in events[:6]]
    if result.get("screenshot"):
        out.append(f"page screenshot: {result['screenshot'].get('path')}")
    out.append("the same figures, in full: fleetpulse report")
    return out
