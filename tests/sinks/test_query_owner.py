"""The process that owns the embedded store answers queries for everyone else, while it writes (a server answers
them itself: tests/fleetpulse/test_query_reads.py)."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from core.errors import StoreError
from fleetpulse.query import ask_owner
from core.settings import load
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.sinks.test_sink_end_to_end import produce, sample

pytestmark = [pytest.mark.integration, pytest.mark.embedded]


@pytest.fixture(autouse=True)
def embedded(settings_env, embedded_clickhouse_url, monkeypatch):
    """The sink owns an embedded store here: the shape in which it answers queries for other processes."""
    monkeypatch.setenv("FLEETPULSE_CLICKHOUSE_URL", embedded_clickhouse_url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_running_sink_serves_sql_and_status(settings_env):
    settings = load(SinkSettings, sink_batch_max_seconds=0.2, sink_port=free_port())
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
        url = f"http://127.0.0.1:{settings.sink_port}/status"
        status = orjson.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read()))
        assert status["ready"] and status["tables"]["gpu_samples"]["rows"] == 96
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert await asyncio.to_thread(ask_owner, settings, "SELECT 1") is None  # nobody serves once it stopped


HOSTILE = {  # statement -> what the refusal says (each was run for real against the endpoint before this guard)
    "INSERT INTO gpu_samples (host) VALUES ('x')": "only SELECT",
    "DROP TABLE gpu_samples": "only SELECT",
    "ALTER TABLE gpu_samples DELETE WHERE 1": "only SELECT",
    "CREATE TABLE evil (x UInt8) ENGINE = Memory": "only SELECT",
    "SYSTEM FLUSH LOGS": "cannot parse|only SELECT",
    "SET readonly = 0": "only SELECT",
    "SELECT * FROM file('/etc/hostname', 'LineAsString')": "table function file\\(\\)",
    "SELECT file('/etc/hostname')": "file\\(\\) is not answered",
    "DESCRIBE TABLE file('/etc/hostname', 'LineAsString')": "table function file\\(\\)",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')": "table function url\\(\\)",
    "SELECT * FROM remote('127.0.0.1:9000', system.one)": "table function remote\\(\\)",
    "SELECT count() FROM gpu_samples WHERE host IN (SELECT * FROM s3('http://x/y.csv'))": "table function s3\\(\\)",
    "SELECT 1; DROP TABLE gpu_samples": "one statement per request",
    "SELECT 1 INTO OUTFILE '/tmp/fleetpulse-outfile-test'": "SYNTAX_ERROR|Syntax error",
}


async def test_the_endpoint_answers_only_bounded_read_only_statements(settings_env):
    settings = load(SinkSettings, sink_batch_max_seconds=0.2, sink_port=free_port(), query_max_rows=1000)
    now = time.time()
    await produce(settings, [sample(h, s, now) for s in range(2) for h in range(3)])
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))

    async def ask(sql: str) -> bytes:
        return await asyncio.to_thread(ask_owner, settings, sql)

    try:
        deadline = time.monotonic() + 60
        while sink.stats.tables["gpu_samples"].rows < 48 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await ask("WITH 2 AS k SELECT k * count() FROM gpu_samples -- a comment\n;") == b"96\n"
        assert b"gpu_samples" in await ask("SHOW TABLES")
        assert b"\npower_w\t" in await ask("DESCRIBE TABLE gpu_samples")
        first = await ask("SELECT host FROM gpu_samples ORDER BY host LIMIT 1 FORMAT JSONEachRow")
        assert first == b'{"host":"h000"}\n'
        assert await ask("SELECT count() FROM numbers(10) WHERE number IN (SELECT * FROM numbers(3))") == b"3\n"
        for sql, why in HOSTILE.items():
            with pytest.raises(StoreError, match=why):
                await ask(sql)
        with pytest.raises(StoreError, match="TOO_MANY_ROWS|Limit for result exceeded"):
            await ask("SELECT number FROM numbers(5000)")
        assert await ask("SELECT count() FROM gpu_samples") == b"48\n"  # nothing was dropped or written
        assert not Path("/tmp/fleetpulse-outfile-test").exists()
        # the refusals left the engine's one session as it was: the sink still writes
        await produce(settings, [sample(7, 0, now)])
        deadline = time.monotonic() + 30
        while sink.stats.tables["gpu_samples"].rows < 56 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await ask("SELECT count() FROM gpu_samples") == b"56\n"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def test_an_endpoint_off_loopback_needs_a_token(settings_env, monkeypatch):
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="sink_host"):
        load(SinkSettings, sink_host="0.0.0.0")
    monkeypatch.setenv("FLEETPULSE_SINK_TOKEN", "t0ken")
    assert load(SinkSettings, sink_host="0.0.0.0").sink_token.get_secret_value() == "t0ken"


async def test_a_token_guards_the_endpoint_when_one_is_set(settings_env, monkeypatch):
    monkeypatch.setenv("FLEETPULSE_SINK_TOKEN", "t0ken")
    settings = load(SinkSettings, sink_port=free_port())
    stop = asyncio.Event()
    task = asyncio.create_task(run_sink(ClickHouseSink(settings), stop))
    try:
        deadline = time.monotonic() + 30
        answer = None
        while answer is None and time.monotonic() < deadline:
            answer = await asyncio.to_thread(ask_owner, settings, "SELECT 1")
            await asyncio.sleep(0.2)
        assert answer == b"1\n"
        anonymous = settings.model_copy(update={"sink_token": None})
        with pytest.raises(StoreError, match="bearer token is required"):
            await asyncio.to_thread(ask_owner, anonymous, "SELECT 1")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_long_analyst_query_leaves_ingestion_running(settings_env):
    # The query takes ~20 s here, more on a busy machine: the limit is raised so that it ends by itself.
    settings = load(SinkSettings, sink_batch_max_seconds=0.2, sink_port=free_port(), query_max_seconds=180)
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))
    now, sent = time.time(), 0
    try:
        while sink.stats.tables["gpu_samples"].rows == 0:
            await produce(settings, [sample(h, sent, now) for h in range(3)])
            sent += 1
            await asyncio.sleep(0.3)
        slow = asyncio.create_task(asyncio.to_thread(
            ask_owner, settings, "SELECT count() FROM numbers(700000000) WHERE sipHash64(number) % 7 = 1"))
        await asyncio.sleep(1.0)  # the query is running now
        during = []
        while not slow.done():
            await produce(settings, [sample(h, sent, now) for h in range(3)])
            sent += 1
            during.append(sink.stats.tables["gpu_samples"].rows)
            await asyncio.sleep(0.5)
        assert int(await slow) > 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    grew = sum(1 for a, b in zip(during, during[1:]) if b > a)
    assert len(during) >= 10 and grew >= len(during) * 0.6, during  # rows kept arriving all through the query
