"""The fleet page's server on the real engine: the browser names a panel and a range and gets that panel's rows;
nothing else reaches the store (no SQL from the browser, a malformed range or an unknown panel refused). The page
itself in real headless Chromium is tests/fleetpulse/test_stack.py (`fleetpulse up --screenshot`)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.settings import CommonSettings
from fleetpulse import page
from fleetpulse.panels import PANELS
from tests.conftest import free_ports
from tests.schemas.test_rollups import START, batches, insert_all, records


@pytest.fixture
async def client(db, clickhouse_url, clickhouse_database):
    insert_all(db, batches(records()))
    settings = CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database,
                              sink_port=free_ports())  # no sink there: the page asks the store itself
    async with TestClient(TestServer(page.make_app(settings))) as c:
        yield c


async def test_a_named_panel_answers_its_rows_for_the_range(client):
    span = await (await client.get("/api/span")).json()
    assert span["gpu_rows"] == 4 * 8 * 200 and span["first"] == START * 1000
    got = await client.get(f"/api/panel/gpu_heatmap?from={span['first']}&to={span['last'] + 1000}")
    body = await got.json()
    assert got.status == 200 and body["columns"][:2] == ["host", "gpu_index"] and len(body["rows"]) == 32
    listed = await (await client.get("/api/panels")).json()
    assert [p["name"] for p in listed] == [p.name for p in PANELS] and "sql" not in listed[0]


async def test_the_bucket_follows_the_range_and_a_demo_s_minutes_read_from_the_raw_rows(client):
    lo = int(START * 1000)
    for span_s, step in ((180, 10), (3600, 15), (86400, 600), (7 * 86400, 3600), (90 * 86400, 43200),
                          (365 * 86400, 2 * 86400)):
        got = await (await client.get(f"/api/panel/utilisation?from={lo}&to={lo + span_s * 1000}")).json()
        assert got["interval_s"] == step and span_s / step <= page.MAX_POINTS
    # three minutes of samples every 10 s, both ends in (as Grafana filters): 19 points, not the rollup's three
    demo = await (await client.get(f"/api/panel/gpu_temperature?from={lo}&to={lo + 180_000}")).json()
    assert len({row[0] for row in demo["rows"]}) == 19 and {row[1] for row in demo["rows"]} == \
        {f"gpu-node-{k:04d}" for k in range(4)}
    hour = await (await client.get(f"/api/panel/gpu_temperature?from={lo}&to={lo + 7200_000}")).json()
    assert hour["interval_s"] == 30 and len({row[0] for row in hour["rows"]}) == 7  # the same samples, 30 s buckets


@pytest.mark.parametrize("path, status", [
    ("/api/panel/drains?from=0&to=100000000000000000", 400),
    ("/api/panel/drop_everything?from=0&to=1", 404),
    ("/api/panel/drains?from=0", 400),
    ("/api/panel/drains?from=abc&to=1", 400),
    ("/api/panel/drains?from=5&to=1", 400),
    ("/api/panel/drains?from=0&to=1;DROP%20TABLE%20gpu_samples", 400),
])
async def test_anything_but_a_panel_name_and_a_range_is_refused(client, path, status):
    assert (await client.get(path)).status == status


async def test_no_endpoint_takes_sql(client):
    for path in ("/api/panel/drains", "/api/query", "/query", "/"):
        got = await client.post(path, data="SELECT * FROM system.tables")
        assert got.status in (404, 405), path


async def test_the_page_and_its_vendored_chart_code_are_served_without_a_cdn(client):
    html = await (await client.get("/")).text()
    assert "/static/vendor/uPlot.iife.min.js" in html and "http" not in html.replace("http-equiv", "")
    js = await client.get("/static/vendor/uPlot.iife.min.js")
    assert js.status == 200 and len(await js.read()) > 40_000
    assert (await client.get("/static/page.js")).status == 200
