"""The sink's least privilege and its tables, on the real store: a sink with the writer's credentials alone runs on
tables the owner made; a writer that may not make them stops the sink with the reason; a table dropped while the sink
runs stops it, and is not silently made again at its next start; its endpoint serves /status and /metrics whatever the
store (and /query only where it owns an embedded one)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest

from core.clickhouse import connect
from core.errors import StoreError
from core.settings import load
from sinks import store
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.conftest import free_ports
from tests.sinks.test_sink_end_to_end import produce, sample, sink_until

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(settings_env) -> SinkSettings:
    return load(SinkSettings, sink_batch_max_seconds=0.3, sink_http=False)


async def test_a_sink_with_the_writers_credentials_alone_runs_on_tables_the_owner_made(settings, clickhouse_url):
    if settings.embedded_store:
        pytest.skip("the embedded store has no users")
    writer = settings.clickhouse_credentials("writer")
    as_writer = settings.model_copy(update={"clickhouse_owner_user": writer[0],  # no owner's password anywhere
                                            "clickhouse_owner_password": settings.clickhouse_writer_password,
                                            "sink_apply_schema": False})
    now = time.time()
    await produce(settings, [sample(h, 0, now) for h in range(4)])
    # before the owner made the tables, the writer's sink stops, naming what is missing and who makes it
    with pytest.raises(StoreError, match="UNKNOWN_DATABASE|missing.*fleetpulse migrate"):
        await sink_until(as_writer, lambda s: False, timeout=30)
    store.prepare(settings)  # the owner's DDL (fleetpulse migrate does the same)
    sink = await sink_until(as_writer, lambda s: s.stats.tables["gpu_samples"].rows >= 32)
    assert sink.stats.tables["gpu_samples"].rows == 32
    # a sink that is to apply the schema with the writer's rights is refused by ClickHouse, and says so
    with pytest.raises(StoreError, match="ACCESS_DENIED|Not enough privileges"):
        await sink_until(as_writer.model_copy(update={"sink_apply_schema": True}), lambda s: False, timeout=30)


async def test_a_table_dropped_while_the_sink_runs_stops_it_and_is_not_made_again_in_silence(settings):
    now = time.time()
    await produce(settings, [sample(h, 0, now) for h in range(4)])
    stop = asyncio.Event()
    task = asyncio.create_task(run_sink(ClickHouseSink(settings), stop))
    owner = connect(settings, "owner")

    def stored() -> int:
        """Rows stored, once their insert is done: the watermark view is pushed after the table's part is visible,
        and a table dropped between the two leaves no watermark (the insert fails, and nothing says it was stored)."""
        try:
            marked = owner.query("SELECT count() FROM sink_watermarks WHERE endsWith(topic, 'fleet.telemetry.samples')")
            return owner.query("SELECT count() FROM gpu_samples").result_rows[0][0] if marked.result_rows[0][0] else 0
        except Exception:  # not made yet
            return 0

    deadline = time.monotonic() + 60
    while stored() < 32:
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.2)
    owner.command("DROP TABLE gpu_samples SYNC")
    await produce(settings, [sample(h, 1, now) for h in range(4)])
    with pytest.raises(StoreError, match="UNKNOWN_TABLE"):
        await asyncio.wait_for(task, 60)
    # restarted, it finds the table gone from a store whose watermarks say it held rows: it stops, saying why
    with pytest.raises(StoreError, match="gpu_samples missing from .* a table was dropped"):
        await sink_until(settings, lambda s: False, timeout=60)
    assert not owner.query("EXISTS TABLE gpu_samples").result_rows[0][0]
    stop.set()


async def test_the_endpoint_serves_status_and_metrics_whatever_the_store(settings):
    settings = settings.model_copy(update={"sink_http": True, "sink_port": free_ports(1)})
    now = time.time()
    await produce(settings, [sample(h, 0, now) for h in range(3)])
    stop = asyncio.Event()
    sink = ClickHouseSink(settings)
    task = asyncio.create_task(run_sink(sink, stop))
    base = f"http://127.0.0.1:{settings.sink_port}"

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    try:
        deadline = time.monotonic() + 60
        while sink.stats.tables["gpu_samples"].rows < 24:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.2)
        status, body = await asyncio.to_thread(get, "/status")
        assert status == 200 and b'"waiting":false' in body and b'"gpu_samples":{"rows":24' in body
        status, metrics = await asyncio.to_thread(get, "/metrics")
        text = metrics.decode()
        assert status == 200 and 'fleetpulse_sink_emitted_total{table="gpu_samples"} 24.0' in text
        assert "fleetpulse_sink_store_waiting 0.0" in text and "fleetpulse_sink_store_outages_total 0.0" in text
        status, _ = await asyncio.to_thread(get, "/query")
        assert status == (405 if settings.embedded_store else 404)  # SQL goes to the server itself
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
