"""A stream worker (child process) and a ClickHouse sink (this process) for end-to-end tests, stopped cleanly after."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from core.settings import load
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.streams.broker import stop_worker

REPO = Path(__file__).resolve().parents[1]


@contextlib.asynccontextmanager
async def worker_and_sink(log: Path, stages: str | None = None, env: dict[str, str] | None = None,
                          seen: list[subprocess.Popen] | None = None):
    """`streams.cli` for `stages` (default all) logging to `log`, and a sink on the same settings; yields the sink
    (and appends the worker's process to `seen`, when given).

    On a failure inside the block the worker is killed (its log tells why); otherwise it must stop on SIGTERM.
    """
    args = [sys.executable, "-m", "streams.cli", *(["--stages", stages] if stages else [])]
    worker = subprocess.Popen(args, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
                                   **(env or {})})
    if seen is not None:
        seen.append(worker)
    sink, stop = ClickHouseSink(load(SinkSettings, sink_batch_max_seconds=0.3, sink_http=False)), asyncio.Event()
    task = asyncio.create_task(run_sink(sink, stop))
    try:
        yield sink
    except BaseException:
        stop_worker(worker, log, failing=True)
        raise
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    stop_worker(worker, log)  # a clean stop flushes whatever the worker still had to send
