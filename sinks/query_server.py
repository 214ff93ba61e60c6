"""HTTP endpoint of the process that owns the embedded store: SQL in, tab-separated rows out; plus /status."""

from __future__ import annotations

import orjson
from aiohttp import web

from sinks.runner import ClickHouseSink


def make_app(sink: ClickHouseSink) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        sql = (await request.text()).strip()
        if not sql:
            return web.Response(status=400, text="empty query\n")
        try:
            body = await sink.query(sql)
        except Exception as exc:  # the caller gets ClickHouse's message, like clickhouse-client prints it
            return web.Response(status=500, text=f"{exc}\n")
        return web.Response(body=body, content_type="text/tab-separated-values")

    async def status(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(sink.stats.as_dict()), content_type="application/json")

    app = web.Application()
    app.router.add_post("/query", query)
    app.router.add_get("/status", status)
    return app


async def serve(sink: ClickHouseSink, port: int) -> web.AppRunner:
    """Start serving on 127.0.0.1:port; the caller cleans up the returned runner."""
    runner = web.AppRunner(make_app(sink), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
