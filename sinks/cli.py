"""`fleetpulse sink`: run the ClickHouse sink until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import signal

from core.settings import load
from sinks.query_server import serve
from sinks.runner import ClickHouseSink
from sinks.settings import SinkSettings


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tables", nargs="*", help="tables to feed (default: all)")
    p.add_argument("--no-query-server", action="store_true", help="do not answer SQL on the query port")


async def run_sink(sink: ClickHouseSink, stop: asyncio.Event) -> ClickHouseSink:
    """Run until `stop` is set; the process that owns an embedded store also answers queries on it."""
    settings = sink.settings
    await sink.open_store()
    runner = None
    if settings.embedded_store and settings.sink_serve_queries:
        runner = await serve(sink, settings.query_port)
    try:
        await sink.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
    return sink


def run(args: argparse.Namespace) -> int:
    settings = load(SinkSettings, sink_tables=args.tables or None,
                    sink_serve_queries=False if args.no_query_server else None)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_sink(ClickHouseSink(settings), stop)

    asyncio.run(main())
    return 0
