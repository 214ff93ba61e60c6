"""`fleetpulse sink`: run the ClickHouse sink until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import signal

from core.settings import load
from sinks.endpoint import serve
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tables", nargs="*", help="tables to feed (default: all)")
    p.add_argument("--no-http", action="store_true", help="serve no /status, /metrics or /query on the sink's port")


async def run_sink(sink: ClickHouseSink, stop: asyncio.Event) -> ClickHouseSink:
    """Run until `stop` is set, serving the sink's endpoint meanwhile (from before the store is open: /status says
    what the sink waits for)."""
    runner = await serve(sink) if sink.settings.sink_http else None
    try:
        await sink.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
    return sink


def run(args: argparse.Namespace) -> int:
    settings = load(SinkSettings, sink_tables=args.tables or None, sink_http=False if args.no_http else None)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_sink(ClickHouseSink(settings), stop)

    asyncio.run(main())
    return 0
