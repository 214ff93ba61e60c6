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
import time
from pathlib import Path

from core.errors import ConfigError, FleetpulseError
from core.logs import quiet_transient_client_logs
from streams.faust_adapter.app import create_app, default_workdir
from streams.faust_adapter.worker import ensure_topics_of, run_worker
from streams.registry import STAGES, WORKERS, select, workers
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
        loop.run_until_complete(ensure_topics_of(settings, app))  # before the children, which then find them made
    except BaseException:
        loop.close()
        raise
    children = _start_children(args, others, settings.streams_metrics_port, settings.streams_web_port)
    try:
        rc = run_worker(settings, app, loop, started, children, lambda: _signal_children(children),
                        getattr(args, "loglevel", "info"))
    finally:
        stopped = _stop_children(children)
    return rc or stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.cli", description=__doc__)
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.loglevel.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_transient_client_logs()
    try:
        return run(args)
    except FleetpulseError as exc:  # a bad setting or flag: its name and the fix, as `fleetpulse streams` says it
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
