"""faust's worker as `fleetpulse streams` runs it: the topics made before it subscribes, its watchdogs (a crashed
stage, a stuck table recovery, a child process gone), its metrics server, its stop and the threads faust leaves."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import faust
from aiokafka.admin import NewTopic

from core.errors import BrokerError, ConfigError
from core.kafka_admin import create_missing
from schemas.provision import ensure_topics
from schemas.topics import INTERNAL
from streams.faust_adapter.app import metrics_of, stage_lag
from streams.faust_adapter.recovery import ReRead, recovery_stall
from streams.faust_adapter.report import partitions_report, report
from streams.groups import app_id
from streams.metrics_server import serve

log = logging.getLogger("fleetpulse.streams")


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


async def ensure_topics_of(settings, app: faust.App, timeout: float = 30.0) -> None:
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


class Worker(faust.Worker):
    """faust's worker, telling this command's children to stop as it begins to: an extra telemetry process stopped only
    after this one left the group would first start taking over its partitions."""

    stop_peers: Callable[[], None] = staticmethod(lambda: None)  # tells this command's child processes to stop
    stopping = False

    async def on_stop(self) -> None:
        self.stopping = True
        self.stop_peers()
        await super().on_stop()

    def _on_sigusr2(self) -> None:
        """SIGUSR2: log each input partition's consumer state (faust's worker would start a debugger on the
        terminal a service does not have); SIGUSR1 stays faust's dump of every task's stack."""
        lanes = getattr(getattr(self.app, "fleetpulse", None), "lanes", ())
        log.warning("consumer state (SIGUSR2):\n%s", report(self.app, lanes))


def run_worker(settings, app: faust.App, loop: asyncio.AbstractEventLoop, started: float | None,
               children: list[subprocess.Popen], stop_children: Callable[[], None], loglevel: str = "info") -> int:
    """Run the worker on `loop` until it stops (SIGTERM/SIGINT, a crashed stage, a stuck recovery, a child process
    gone); its exit code."""
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
    worker = Worker(app, loop=loop, loglevel=loglevel, quiet=True,
                     redirect_stdouts=False, override_logging=not logging.getLogger().handlers)
    if not sys.stdout.isatty():
        worker.spinner = None  # its terminal escape codes would only litter captured logs
    worker.stop_peers = stop_children
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
    leave_lingering_threads(code)
    return code


def leave_lingering_threads(code: int, grace_s: float = 5.0) -> None:
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
