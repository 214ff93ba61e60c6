"""`fleetpulse streams`: run the stream workers of the chosen stages until SIGTERM/SIGINT.

Each worker (streams/registry.py WORKERS) is one faust app and consumer group in a process of its own: without
--worker, this process runs the first worker the chosen stages need and starts the others as child processes, which
die with it (Linux PR_SET_PDEATHSIG) and are stopped with it; a child that exits stops this process (exit 1), so a
supervisor restarts the set. The telemetry worker runs as one process per core (at most the samples topic's partitions;
--telemetry-processes N or FLEETPULSE_STREAMS_TELEMETRY_PROCESSES sets N): the extra ones are children, each with a
faust data directory of its own, in the telemetry group, a share of the partitions each (without --worker only). --worker runs exactly one (a deployment that scales them apart).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import faust
from aiokafka.admin import NewTopic

from core.errors import BrokerError, ConfigError
from core.logs import quiet_transient_client_logs
from core.kafka_admin import create_missing
from schemas.provision import ensure_topics
from schemas.topics import INTERNAL
from streams.app import app_id, create_app, default_workdir, metrics_of, stage_lag
from streams.metrics_server import serve
from streams.registry import STAGES, WORKERS, select, workers
from streams.runtime.recovery import ReRead, recovery_stall
from streams.runtime.report import partitions_report, report
from streams.settings import streams_settings, telemetry_processes

log = logging.getLogger("fleetpulse.streams")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stages", help=f"comma-separated stages (default: FLEETPULSE_STAGES, else all): "
                                    f"{', '.join(STAGES)}")
    p.add_argument("--worker", choices=WORKERS, help="run only this worker's share of the stages (default: every "
                                                     "worker they need, one process each)")
    p.add_argument("--workdir", type=Path, help="faust data directory (default: <data_dir>/streams; the Nth extra "
                                                 "telemetry process: the same with -N appended)")
    p.add_argument("--telemetry-processes", metavar="N", help="telemetry worker processes in the group, or auto "
                                                              "(one per core, at most the samples topic's "
                                                              "partitions); not with --worker (default: FLEETPULSE_"
                                                              "STREAMS_TELEMETRY_PROCESSES, else auto)")
    p.add_argument("--loglevel", default="info", help="worker log level (default: info)")


def internal_topics(app_id: str, replication: int) -> list[NewTopic]:
    """The registry's internal topics under this worker's app id: created before the worker subscribes, or faust
    skips them until its next metadata refresh (a fresh namespace then produces nothing for minutes)."""
    return [NewTopic(t.full(app_id), t.partitions, replication) for t in INTERNAL.values()]


def changelog_topics(app: faust.App, replication: int) -> list[NewTopic]:
    """The worker's table changelogs, compacted, as faust would declare them: made before it subscribes too. A
    changelog not yet in the cluster's metadata when the group assigns is left out of the assignment ("Ignoring
    missing topic"), and no rebalance brings it back: on a fresh broker the worker then never finished its first
    batch, its records handed out and never acknowledged (one CI run in three, and a new evaluate test)."""
    return [NewTopic(t.changelog_topic.get_topic_name(), t.partitions or app.conf.topic_partitions, replication,
                     topic_configs={"cleanup.policy": "compact", **t.extra_topic_configs}) for t in app.tables.values()]


async def _ensure_topics(settings, app: faust.App, timeout: float = 30.0) -> None:
    """Create the registry's topics first: subscribing to a missing topic would auto-create it with 1 partition.
    Changelogs that exist get today's settings (one made by an earlier version may keep segments open for days)."""
    changelogs = changelog_topics(app, settings.replication)
    aligned: dict[str, dict[str, str | None]] = {}
    try:
        async with asyncio.timeout(timeout):
            created = await ensure_topics(settings.kafka_client_args(), settings.topic_prefix,
                                          settings.replication)
            created += await create_missing(settings.kafka_client_args(),
                                            internal_topics(app_id(settings.topic_prefix), settings.replication)
                                            + changelogs, aligned=aligned)
    except BrokerError:
        raise  # already says why (a refused password, an unknown CA, nothing listening)
    except Exception as exc:  # noqa: BLE001 - connection refused, timeout, auth: the broker is not usable
        raise BrokerError(f"cannot create topics on {settings.bootstrap}: {exc!r}") from exc
    if created:
        log.info("created %d topics under prefix %r", len(created), settings.topic_prefix)
    wanted = {nt.name: nt.topic_configs for nt in changelogs}
    for topic, was in aligned.items():
        log.info("changelog %s: %s", topic, ", ".join(f"{k} {v} -> {wanted[topic][k]}" for k, v in was.items()))


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies, however it dies (a kill -9 takes the set down)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def child_workers(needed: list[str], telemetry_processes: int, workdir: Path) -> list[tuple[str, Path | None]]:
    """(worker, its own faust data directory or None for `workdir`) of each child: every worker the stages need but
    the first (this process's), then the extra telemetry processes, each in `workdir` with -1, -2, ... appended (two
    processes of one worker must not share one)."""
    extra = telemetry_processes - 1 if "telemetry" in needed else 0
    return [(w, None) for w in needed[1:]] + [("telemetry", Path(f"{workdir.resolve()}-{n}"))
                                              for n in range(1, extra + 1)]


def _start_children(args: argparse.Namespace, others: list[tuple[str, Path | None]], port: int | None,
                    web_port: int | None = None) -> list[subprocess.Popen]:
    """One `streams.cli --worker W` process per child, same stages, settings and log streams as this one.
    A configured metrics or faust web port moves up by one per child (0, any free port, stays 0)."""
    children = []
    for k, (worker, own) in enumerate(others, start=1):
        cmd = [sys.executable, "-m", "streams.cli", "--worker", worker, "--loglevel", getattr(args, "loglevel", "info")]
        if getattr(args, "stages", None):
            cmd += ["--stages", args.stages]
        workdir = own or getattr(args, "workdir", None)
        if workdir:
            cmd += ["--workdir", str(workdir)]
        env = dict(os.environ)
        for name, base in (("FLEETPULSE_STREAMS_METRICS_PORT", port), ("FLEETPULSE_STREAMS_WEB_PORT", web_port)):
            if base:
                env[name] = str(base + k)
        children.append(subprocess.Popen(cmd, env=env,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None))
        log.info("started the %s worker (pid %d%s)", worker, children[-1].pid, f", {own}" if own else "")
    return children


def _signal_children(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)


def _stop_children(children: list[subprocess.Popen], timeout: float = 30.0) -> int:
    """SIGTERM each running child and wait for them all (SIGKILL after `timeout`); the worst exit status: a child
    that stopped on a signal other than SIGTERM counts as 1."""
    _signal_children(children)
    worst, deadline = 0, time.monotonic() + timeout
    for child in children:
        try:
            rc = child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker pid %d ignored SIGTERM for %.0f s: killed", child.pid, timeout)
            child.kill()
            rc = child.wait()
        worst = worst or (rc if rc > 0 else 1 if rc not in (0, -signal.SIGTERM) else 0)
    return worst


class _Worker(faust.Worker):
    """faust's worker, telling this command's children to stop as it begins to: an extra telemetry process stopped only
    after this one left the group would first start taking over its partitions."""

    peers: list[subprocess.Popen] = []  # this command's child processes (set before it runs)
    stopping = False

    async def on_stop(self) -> None:
        self.stopping = True
        _signal_children(self.peers)
        await super().on_stop()

    def _on_sigusr2(self) -> None:
        """SIGUSR2: log each input partition's consumer state (faust's worker would start a debugger on the
        terminal a service does not have); SIGUSR1 stays faust's dump of every task's stack."""
        lanes = getattr(getattr(self.app, "fleetpulse", None), "lanes", ())
        log.warning("consumer state (SIGUSR2):\n%s", report(self.app, lanes))


def run(args: argparse.Namespace) -> int:
    """Start the first worker the stages need in this process and the others as children; --worker: just that one.
    A second process with the same settings and worker joins the same consumer group."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if getattr(args, "stages", None) else None
    processes = getattr(args, "telemetry_processes", None)
    if processes is not None and getattr(args, "worker", None):
        raise ConfigError("--telemetry-processes starts processes of the telemetry worker; --worker runs exactly one")
    settings = streams_settings(stages=stages, **({} if processes is None else
                                                   {"streams_telemetry_processes": processes}))
    needed = list(workers(select(settings.stages)))
    others = [] if getattr(args, "worker", None) else child_workers(
        needed, telemetry_processes(settings), default_workdir(settings, getattr(args, "workdir", None)))
    for name, port in (("FLEETPULSE_STREAMS_METRICS_PORT", settings.streams_metrics_port),
                       ("FLEETPULSE_STREAMS_WEB_PORT", settings.streams_web_port)):
        if port and port + len(others) > 65535:
            raise ConfigError(f"{name} {port}: its {len(others)} child processes serve on the ports after it, "
                              "past 65535")
    mine = getattr(args, "worker", None) or needed[0]
    app = create_app(settings, worker=mine, workdir=getattr(args, "workdir", None))
    if settings.streams_gc_young:  # most garbage here is acyclic and freed at once; cycles wait a little longer
        gc.set_threshold(settings.streams_gc_young, 20, 100)
    loop = asyncio.new_event_loop()  # the worker's loop; asyncio.run() would leave none current for faust
    asyncio.set_event_loop(loop)
    started = time.monotonic()
    try:
        loop.run_until_complete(_ensure_topics(settings, app))  # before the children, which then find them made
    except BaseException:
        loop.close()
        raise
    children = _start_children(args, others, settings.streams_metrics_port, settings.streams_web_port)
    try:
        rc = _run_worker(args, settings, app, loop, started, children)
    finally:
        stopped = _stop_children(children)
    return rc or stopped


def _run_worker(args: argparse.Namespace, settings, app: faust.App, loop: asyncio.AbstractEventLoop,
                started: float | None, children: list[subprocess.Popen]) -> int:
    lost: list[subprocess.Popen] = []
    gave_up: list[str] = []

    @app.timer(1.0)
    async def _watch_stages() -> None:
        for name, m in list(metrics_of(app).items()):
            if not gave_up and m.crashes:  # its lane takes no more records (streams/runtime/lane.py)
                gave_up.append(name)
                log.critical("stage %s crashed (%s): stopping the worker; the next one reads what it had not "
                             "finished again", name, m.last_error)
                os.kill(os.getpid(), signal.SIGTERM)

    rebalanced_at = [0.0]

    async def _rebalancing(sender, *args, **kwargs) -> None:
        rebalanced_at[0] = time.monotonic()  # the group regroups: no record comes meanwhile

    app.on_partitions_revoked.connect(_rebalancing)
    app.on_partitions_assigned.connect(_rebalancing)

    async def _watch_recovery() -> None:
        """A task of its own, not an app timer: faust starts its timers only after the first recovery, which a
        restarted worker's is."""
        limit = settings.streams_recovery_stall_s
        reread = ReRead(app, settings.streams_recovery_reread_s, report=partitions_report, metrics=metrics_of(app))
        while not gave_up:
            await asyncio.sleep(5.0)
            try:
                stall = recovery_stall(app, time.monotonic(), limit, rebalanced_at[0])
                if stall is None:
                    await reread.check(time.monotonic(), rebalanced_at[0])
            except Exception as exc:  # noqa: BLE001 - a faust without this bookkeeping: say so once, watch no more
                log.warning("table recovery watchdog off: %r", exc)
                return
            if stall is not None and not gave_up:
                gave_up.append("recovery")
                log.critical("table recovery received no changelog record for %.0fs with %d left to read "
                             "(FLEETPULSE_STREAMS_RECOVERY_STALL_S=%g): stopping the worker; the next one recovers "
                             "afresh", *stall, limit)
                deadline = threading.Timer(60.0, os._exit, (1,))  # should the stop itself hang on the stuck consumer
                deadline.daemon = True
                deadline.start()
                os.kill(os.getpid(), signal.SIGTERM)

    @app.timer(1.0)
    async def _watch_children() -> None:
        if worker.stopping:  # it told them to stop
            return
        for child in children:
            if child.poll() is not None and not lost:
                lost.append(child)
                log.error("worker pid %d exited with %s: stopping this one too", child.pid, child.returncode)
                os.kill(os.getpid(), signal.SIGTERM)  # faust's own shutdown: stop, commit, close

    @app.on_rebalance_complete.connect
    async def _startup_time(sender, **kwargs) -> None:
        nonlocal started
        if started is not None:
            log.info("worker start-up took %.1fs (to first completed rebalance)", time.monotonic() - started)
            started = None

    server = None
    if settings.streams_metrics_port is not None:
        try:
            server = serve(metrics_of(app), settings.streams_metrics_port, settings.streams_metrics_addr,
                           lag=lambda: stage_lag(app))
        except OSError as exc:
            loop.close()
            raise ConfigError(f"FLEETPULSE_STREAMS_METRICS_PORT {settings.streams_metrics_port}: {exc.strerror}") \
                from exc
    worker = _Worker(app, loop=loop, loglevel=getattr(args, "loglevel", "info"), quiet=True,
                     redirect_stdouts=False, override_logging=not logging.getLogger().handlers)
    if not sys.stdout.isatty():
        worker.spinner = None  # its terminal escape codes would only litter captured logs
    worker.peers = children
    app.recovery_watchdog = loop.create_task(_watch_recovery())  # runs once the worker runs the loop
    code = 0
    try:
        worker.execute_from_commandline()  # installs SIGINT/SIGTERM handlers: stop, commit, close the loop
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    code = code or (1 if lost or gave_up else 0)
    _leave_lingering_threads(code)
    return code


def _leave_lingering_threads(code: int, grace_s: float = 5.0) -> None:
    """faust's stop is done (outputs flushed, offsets committed, the loop closed), but a consumer thread told to stop
    in the middle of a group join finishes the join first and may never return: the interpreter would wait for it at
    exit for ever (the worker seen ignoring SIGTERM). Threads get `grace_s`; then the process leaves without them."""
    deadline = time.monotonic() + grace_s
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
             and t.is_alive()]
    if alive:
        log.warning("stopped; %d thread(s) still running %.0f s after the stop (%s): leaving without them", len(alive),
                    grace_s, ", ".join(alive))
        logging.shutdown()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.cli", description=__doc__)
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.loglevel.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_transient_client_logs()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
