"""The sink's HTTP endpoint: /status (JSON: tables, and whether it waits on its store) and /metrics (Prometheus) in
every mode; /query, SQL in and rows out (read-only, sinks/query_guard.py), where the sink owns an embedded store and
is the one process that may open it. Loopback by default; bound elsewhere, every request must carry the configured
bearer token."""

from __future__ import annotations

import hmac

import orjson
from aiohttp import web

from sinks.query_guard import QueryRefused
from sinks.sink import ClickHouseSink
from sinks.status import exposition


def make_app(sink: ClickHouseSink) -> web.Application:
    token = sink.settings.sink_token.get_secret_value() if sink.settings.sink_token is not None else None

    @web.middleware
    async def authorised(request: web.Request, handler):
        given = request.headers.get("Authorization", "")
        if token is not None and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return web.Response(status=401, text="a bearer token is required (FLEETPULSE_SINK_TOKEN)\n")
        return await handler(request)

    async def query(request: web.Request) -> web.Response:
        sql = await request.text()
        try:
            body = await sink.query(sql)
        except QueryRefused as exc:
            return web.Response(status=exc.status, text=f"refused: {exc}\n")
        except Exception as exc:  # the caller gets ClickHouse's message, like clickhouse-client prints it
            return web.Response(status=500, text=f"{exc}\n")
        return web.Response(body=body, content_type="text/tab-separated-values")

    async def status(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(sink.stats.as_dict()), content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=exposition(sink.stats), content_type="text/plain", charset="utf-8")

    app = web.Application(middlewares=[authorised], client_max_size=1024 * 1024)
    if sink.settings.embedded_store:
        app.router.add_post("/query", query)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(sink: ClickHouseSink) -> web.AppRunner:
    """Start serving on sink_host (loopback by default):sink_port; the caller cleans up the runner."""
    runner = web.AppRunner(make_app(sink), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, sink.settings.sink_host, sink.settings.sink_port).start()
    return runner
