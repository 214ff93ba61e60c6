"""`fleetpulse streams`: run a faust stream worker for the chosen stages until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

import faust
from aiokafka.admin import NewTopic

from core.errors import BrokerError, ConfigError
from core.kafka_admin import create_missing
from schemas.provision import ensure_topics
from schemas.topics import INTERNAL
from streams.app import create_app, metrics_of, stage_lag
from streams.metrics_server import serve
from streams.registry import STAGES
from streams.settings import streams_settings

log = logging.getLogger("fleetpulse.streams")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stages", help=f"comma-separated stages (default: FLEETPULSE_STAGES, else all): "
                                    f"{', '.join(STAGES)}")
    p.add_argument("--workdir", type=Path, help="faust data directory (default: <data_dir>/streams)")
    p.add_argument("--loglevel", default="info", help="worker log level (default: info)")


def internal_topics(app_id: str, replication: int) -> list[NewTopic]:
    """The registry's internal topics under this worker's app id: created before the worker subscribes, or faust
    skips them until its next metadata refresh (a fresh namespace then produces nothing for minutes)."""
    return [NewTopic(t.full(app_id), t.partitions, replication) for t in INTERNAL.values()]


async def _ensure_topics(settings, app: faust.App, timeout: float = 30.0) -> None:
    """Create the registry's topics first: subscribing to a missing topic would auto-create it with 1 partition."""
    try:
        async with asyncio.timeout(timeout):
            created = await ensure_topics(settings.kafka_client_args(), settings.topic_prefix,
                                          settings.streams_replication)
            created += await create_missing(settings.kafka_client_args(),
                                            internal_topics(app.conf.id, settings.streams_replication))
    except Exception as exc:  # noqa: BLE001 - connection refused, timeout, auth: the broker is not usable
        raise BrokerError(f"cannot create topics on {settings.bootstrap}: {exc!r}") from exc
    if created:
        log.info("created %d topics under prefix %r", len(created), settings.topic_prefix)


def run(args: argparse.Namespace) -> int:
    """Start one worker in this process; a second one with the same settings joins the same consumer group."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if getattr(args, "stages", None) else None
    settings = streams_settings(stages=stages)
    app = create_app(settings, workdir=getattr(args, "workdir", None))
    loop = asyncio.new_event_loop()  # the worker's loop; asyncio.run() would leave none current for faust
    asyncio.set_event_loop(loop)
    started: float | None = time.monotonic()
    try:
        loop.run_until_complete(_ensure_topics(settings, app))
    except BaseException:
        loop.close()
        raise

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
    worker = faust.Worker(app, loop=loop, loglevel=getattr(args, "loglevel", "info"), quiet=True,
                          redirect_stdouts=False, override_logging=not logging.getLogger().handlers)
    if not sys.stdout.isatty():
        worker.spinner = None  # its terminal escape codes would only litter captured logs
    try:
        worker.execute_from_commandline()  # installs SIGINT/SIGTERM handlers: stop, commit, close the loop
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.cli", description=__doc__)
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.loglevel.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
