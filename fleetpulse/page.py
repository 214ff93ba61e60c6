"""`fleetpulse page`: the fleet page, a web dashboard over the store (docs/page.md).

It serves one HTML page, its script and the vendored chart code (fleetpulse/web; no CDN), and answers the page's
requests for the named panels of fleetpulse/panels.py over a time range: the browser names a panel and gives the
range in epoch milliseconds, never SQL. Each panel's query goes where `fleetpulse query` sends it: to the server as
the read-only analyst, or, on the embedded store, to the running sink that owns it (read-only through the guard),
else to the store itself. `fleetpulse up` serves it while it runs and prints its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from core.errors import FleetpulseError, StoreError
from core.metrics import Latency, MetricSpec, shared
from core.settings import CommonSettings, load
from fleetpulse import outcomes
from fleetpulse.alert_feed import AlertFeed
from fleetpulse.panels import BY_NAME, PANELS, expand
from fleetpulse.query import query

log = logging.getLogger("fleetpulse.page")
WEB = Path(__file__).with_name("web")
DEFAULT_SPAN_S = 15 * 60
LATEST_MS = 4_102_444_800_000  # 2100-01-01: past ClickHouse's DateTime range
MAX_POINTS = 240  # buckets per time series: the interval grows with the range
# Bucket widths a reader counts in: a demo's minutes in 10 s steps, a day in 10 minutes, a month in hours.
STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def bucket_s(span_ms: int) -> int:
    """The narrowest step that keeps a range within MAX_POINTS buckets (whole days past the last step)."""
    need = span_ms / 1000 / MAX_POINTS
    return next((s for s in STEPS_S if s >= need), -(-int(need) // 86400) * 86400)


def _range(request: web.Request) -> tuple[datetime, datetime, int]:
    """[from, to] (epoch ms) and the bucket width in seconds from the request; 400 on anything else."""
    try:
        lo, hi = int(request.query["from"]), int(request.query["to"])
    except (KeyError, ValueError):
        raise web.HTTPBadRequest(text="from and to: epoch milliseconds\n") from None
    if not 0 <= lo < hi <= LATEST_MS:
        raise web.HTTPBadRequest(text="from must be before to, both within 1970-2100\n")
    start, end = (datetime.fromtimestamp(t / 1000, timezone.utc) for t in (lo, hi))
    return start, end, bucket_s(hi - lo)


RECEIVED = shared("page", "received", "requests, by route", ["route"])
EMITTED = shared("page", "emitted", "answers sent (any status but 5xx), by route", ["route"])
ERRORS = shared("page", "errors", "answers that failed (5xx: the store did not answer, or the page raised), by route",
                ["route"])
BATCH = shared("page", "batch_seconds", "one answer, by route", ["route"])
LAG = shared("page", "lag_seconds", "when the page last asked the store's span, minus the newest sample stored")
CATALOGUE: tuple[MetricSpec, ...] = (RECEIVED, EMITTED, ERRORS, BATCH, LAG)
FEED = web.AppKey("alert_feed", AlertFeed)


@dataclass
class PageCounts:
    received: Counter[str] = field(default_factory=Counter)
    emitted: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latency: dict[str, Latency] = field(default_factory=dict)
    lag_s: float | None = None


class PageMetrics(Collector):
    def __init__(self, counts: PageCounts):
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        c = self.counts
        routes = sorted(c.received)
        yield RECEIVED.of(([r], c.received[r]) for r in routes)
        yield EMITTED.of(([r], c.emitted[r]) for r in routes)
        yield ERRORS.of(([r], c.errors[r]) for r in routes)
        yield BATCH.of(([r], c.latency[r]) for r in routes if r in c.latency)
        if c.lag_s is not None:
            yield LAG.family(c.lag_s)


def make_app(settings: CommonSettings, owner_only: bool = False) -> web.Application:
    """The page's routes. owner_only (inside `up`): on an embedded store ask only the running sink that owns it, never
    open it beside the sink."""

    how = {"open_store": not owner_only, "timeout": 30 if owner_only else 300}
    counts, feed = PageCounts(), AlertFeed(settings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PageMetrics(counts))
    ProcessCollector(registry=registry)

    @web.middleware
    async def counted(request: web.Request, handler):
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        counts.received[route] += 1
        began, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            (counts.errors if status >= 500 else counts.emitted)[route] += 1
            counts.latency.setdefault(route, Latency()).observe(time.perf_counter() - began)

    def ask_rows(sql: str) -> tuple[list[str], list[str], bytes]:
        """Column names, types and the rows as one JSON array, the rows passed through as the store wrote them: a
        panel over thousands of hosts is hundreds of thousands of rows, which parsed and written again cost seconds
        and left `up` ~0.5 MB larger after every answer (bench/fleet_scale.py). A JSON string holds no raw newline,
        so the store's one row per line joins with commas."""
        raw = query(settings, f"{sql}\nFORMAT JSONCompactEachRowWithNamesAndTypes", **how)
        names, types, rows = (raw.split(b"\n", 2) + [b"", b""])[:3]
        return orjson.loads(names), orjson.loads(types), b"[" + rows.rstrip(b"\n").replace(b"\n", b",") + b"]"

    async def answer(call, *args):
        try:
            return await asyncio.to_thread(call, *args)
        except StoreError as exc:
            raise web.HTTPServiceUnavailable(text=f"the store did not answer: {exc}\n") from None

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB / "index.html")

    async def panels(_: web.Request) -> web.Response:
        return web.json_response([{"name": p.name, "title": p.title, "kind": p.kind, "unit": p.unit,
                                   "description": p.description, "width": p.width} for p in PANELS])

    async def span(_: web.Request) -> web.Response:
        """The range the store holds samples for (a simulated fleet may run ahead of the clock)."""
        _, _, rows = await answer(ask_rows, "SELECT toUnixTimestamp64Milli(min(ts)), toUnixTimestamp64Milli(max(ts)), "
                                            "count() FROM gpu_samples")
        [[first, last, n]] = orjson.loads(rows)
        if int(n):
            counts.lag_s = max(0.0, time.time() - int(last) / 1000)
        held = await answer(outcomes.span, outcomes.asker(settings, **how)) if int(n) else None
        return web.json_response({"first": int(first), "last": int(last), "gpu_rows": int(n),
                                  "outcomes_last": int(held[1].timestamp() * 1000) if held else None,
                                  "default_span_ms": DEFAULT_SPAN_S * 1000})

    async def figures(request: web.Request) -> web.Response:
        """The range's outcomes, as `fleetpulse report --from --to` gives them (fleetpulse/outcomes.py)."""
        start, end, _ = _range(request)
        got = await answer(outcomes.figures, outcomes.asker(settings, **how), outcomes.Range(start, end))
        return web.json_response(got, dumps=lambda v: orjson.dumps(v).decode())

    async def panel(request: web.Request) -> web.Response:
        chosen = BY_NAME.get(request.match_info["name"])
        if chosen is None:
            raise web.HTTPNotFound(text=f"no panel {request.match_info['name']!r}\n")
        start, end, interval = _range(request)
        sql = expand(chosen.fine_sql if interval < 60 and chosen.fine_sql else chosen.sql, start, end, interval)
        names, types, rows = await answer(ask_rows, sql)
        head = orjson.dumps({"name": chosen.name, "columns": names, "types": types, "interval_s": interval})
        return web.Response(body=head[:-1] + b',"rows":' + rows + b"}", content_type="application/json")

    async def pipeline(_: web.Request) -> web.Response:
        """PipelineLagging and FleetSilent as the alert topic has them now (fleetpulse/alert_feed.py)."""
        return web.json_response(feed.state(), dumps=lambda v: orjson.dumps(v).decode())

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    async def follow(_: web.Application):
        await feed.start()
        yield
        await feed.stop()

    app = web.Application(middlewares=[counted])
    app.cleanup_ctx.append(follow)
    app[FEED] = feed
    app.router.add_get("/", index)
    app.router.add_get("/api/panels", panels)
    app.router.add_get("/api/span", span)
    app.router.add_get("/api/outcomes", figures)
    app.router.add_get("/api/panel/{name}", panel)
    app.router.add_get("/api/pipeline", pipeline)
    app.router.add_get("/metrics", metrics)
    app.router.add_static("/static", WEB)
    return app


async def serve(settings: CommonSettings, host: str = "127.0.0.1", port: int | None = None,
                owner_only: bool = False) -> web.AppRunner:
    """Start serving; the caller cleans the runner up."""
    _map_large_buffers_alone()
    runner = web.AppRunner(make_app(settings, owner_only), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port or settings.page_port).start()
    except OSError as exc:
        await runner.cleanup()
        raise FleetpulseError(f"the fleet page cannot listen on {host}:{port or settings.page_port}: {exc}") from None
    return runner


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _map_large_buffers_alone() -> None:
    """A panel's answer is tens of MB at thousands of hosts, read in a worker thread. glibc raises its mmap threshold
    to the largest buffer freed, so the next ones come from that thread's arena, which keeps the memory once they are
    freed: `up` (which serves the page) grew 82 -> 172 MB in steps of ~45 MB after page requests at 6,000 hosts
    (bench/fleet_scale.py). A fixed threshold maps every buffer over 1 MiB on its own and unmaps it when freed. Not
    glibc: nothing to set."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):
        pass


def chromium() -> str:
    """The distribution's Chromium (Playwright's own browser download is not needed)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise FleetpulseError("no Chromium found on PATH: install the distribution's package (apt-get install chromium)")


async def screenshot(url: str, path: Path, wait_s: float = 20.0) -> dict:
    """Load the page in headless Chromium, wait until every panel has drawn, save a full-page screenshot; returns
    what the page showed (panel -> rows, panel -> its text, its range and the range's outcomes) and its console
    errors."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        raise FleetpulseError("the screenshot needs Playwright for Python (pip install playwright)") from None
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page(viewport={"width": 1600, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(url)
            await page.wait_for_function("window.fleetpulse && window.fleetpulse.drawn >= 1", timeout=wait_s * 1000)
            shown = await page.evaluate("window.fleetpulse.rows")
            drawn = await page.evaluate("({range: window.fleetpulse.range, outcomes: window.fleetpulse.outcomes})")
            text = await page.evaluate("Object.fromEntries([...document.querySelectorAll('section[data-panel]')]"
                                       ".map(s => [s.dataset.panel, s.innerText]))")
            path.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(path), full_page=True)
        finally:
            await browser.close()
    return {"rows": shown, "text": text, "console_errors": errors, **drawn}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=None, help="port (default FLEETPULSE_PAGE_PORT, 18124)")
    p.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                   help="load the page in headless Chromium, write its screenshot there, and exit")


async def _run(args: argparse.Namespace, settings: CommonSettings) -> int:
    runner = await serve(settings, args.host, args.port)
    url = f"http://{args.host}:{args.port or settings.page_port}/"
    try:
        if args.screenshot is not None:
            shown = await screenshot(url, args.screenshot)
            print(orjson.dumps({"url": url, "screenshot": str(args.screenshot), "rows": shown["rows"],
                                "console_errors": shown["console_errors"]}).decode())
            return 1 if shown["console_errors"] else 0
        print(f"fleet page on {url} (Ctrl-C stops it)", flush=True)
        await asyncio.Event().wait()
        return 0
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args, load(CommonSettings)))
    except KeyboardInterrupt:
        return 0
