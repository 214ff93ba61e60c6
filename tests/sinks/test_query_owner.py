"""The process that owns the embedded store answers queries for everyone else, while it writes."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import orjson
import pytest

from core.errors import StoreError
from fleetpulse.query import ask_owner
from core.settings import load
from sinks.cli import run_sink
from sinks.runner import ClickHouseSink
from sinks.settings import SinkSettings
from tests.sinks.test_sink_end_to_end import produce, sample

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_running_sink_serves_sql_and_status(settings_env):
    settings = load(SinkSettings, sink_batch_max_seconds=0.2, query_port=free_port())
    now = time.time()
    await produce(settings, [sample(h, s, now) for s in range(4) for h in range(3)])
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))
    try:
        deadline = time.monotonic() + 60
        while sink.stats.tables["gpu_samples"].rows < 96 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        answer = await asyncio.to_thread(ask_owner, settings, "SELECT host, count() FROM gpu_samples GROUP BY host ORDER BY host")
        assert answer == b"h000\t32\nh001\t32\nh002\t32\n"
        csv = await asyncio.to_thread(ask_owner, settings, "SELECT count() FROM gpu_samples FORMAT CSV;")
        assert csv == b"96\n"
        with pytest.raises(StoreError, match="UNKNOWN_TABLE|does not exist"):
            await asyncio.to_thread(ask_owner, settings, "SELECT * FROM no_such_table")
        url = f"http://127.0.0.1:{settings.query_port}/status"
        status = orjson.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read()))
        assert status["ready"] and status["tables"]["gpu_samples"]["rows"] == 96
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert await asyncio.to_thread(ask_owner, settings, "SELECT 1") is None  # nobody serves once it stopped
