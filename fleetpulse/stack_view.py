"""The live terminal view of `fleetpulse up`: messages/s per topic, rows written, alerts firing, usable compute."""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request

import orjson
from rich.console import Console
from rich.live import Live
from rich.text import Text

from core.settings import CommonSettings
from fleetpulse.query import query
from schemas.tables import TABLES

# Until the lifecycle stage publishes it (usable_compute, with its installed GPUs), usable compute = GPUs that
# reported in the last 10 s of simulated time and carry no firing critical/page alert, over the GPUs that reported
# in the last 15 minutes (installed). gpu_samples, which every GPU adds to every 10 s, is read only over those
# windows or from its parts' metadata (max(ts)): read whole every second, the store's CPU grew with the run (0.56 ->
# 0.96 cores over an hour at 6,000 hosts, bench/fleet_scale.py). The other tables grow with events, not samples.
FACTS_SQL = """
WITH (SELECT max(ts) FROM gpu_samples) AS now_ts,
firing AS (
    SELECT host, gpu_index FROM alerts
    GROUP BY fingerprint, host, gpu_index
    HAVING argMax(status, ts) = 'firing' AND argMax(severity, ts) IN ('critical', 'page')
)
SELECT
    (SELECT count() FROM alerts) AS alert_messages,
    (SELECT count() FROM (SELECT fingerprint FROM alerts GROUP BY fingerprint HAVING argMax(status, ts) = 'firing')) AS firing,
    (SELECT uniqExact(host, gpu_index) FROM gpu_samples WHERE ts > now_ts - INTERVAL 15 MINUTE) AS installed,
    (SELECT uniqExact(host, gpu_index) FROM gpu_samples
      WHERE ts > now_ts - INTERVAL 10 SECOND AND (host, toNullable(gpu_index)) NOT IN (SELECT host, gpu_index FROM firing)) AS usable,
    (SELECT count() FROM usable_compute) AS lifecycle_minutes,
    (SELECT toInt64(round(argMax(usable_compute, minute_ts) * 1e6)) FROM usable_compute) AS lifecycle_usable_ppm,
    (SELECT toInt64(round(argMax(installed_gpus, minute_ts))) FROM usable_compute) AS lifecycle_installed,
    (SELECT count() FROM interruptions WHERE bin != 'ignore') AS interruptions,  -- as the report counts them
    (SELECT uniqExact(event_id) FROM drain_events WHERE action = 'drain') AS drains,
    (SELECT count() FROM (SELECT DISTINCT host, since FROM node_states
                          WHERE state = 'healthy' AND prev_state = 'validating')) AS returns,
    (SELECT uniqExact(job, rank) FROM stragglers WHERE flagged) AS stragglers
"""
FACT_NAMES = ("alert_messages", "firing", "installed", "usable", "lifecycle_minutes", "lifecycle_usable_ppm",
              "lifecycle_installed", "interruptions", "drains", "returns", "stragglers")
# What happened, newest first: alerts fired, faults found, stragglers flagged, node state changes, bot requests.
EVENTS_SQL = """
SELECT toUnixTimestamp64Milli(ts) AS at, line FROM (
    SELECT starts_at AS ts, concat('alert      ', any(alertname), ' on ',
                                   multiIf(any(host) != '', any(host), any(rack) != '', concat('rack ', any(rack)),
                                           any(labels['job']) != '', concat('job ', any(labels['job'])), 'the fleet'),
                                   ifNull(concat(' GPU ', toString(any(gpu_index))), '')) AS line
    FROM alerts WHERE status = 'firing' GROUP BY fingerprint, starts_at
    UNION ALL
    SELECT min(ts), concat('fault      ', any(code), ' on ', any(host),
                           ifNull(concat(' GPU ', toString(any(gpu_index))), ''), ' -> bin ', any(bin))
    FROM faults GROUP BY fault_id
    UNION ALL
    SELECT min(ts), concat('straggler  ', job, ' rank ', toString(rank), ' on ', any(host), ', ',
                           toString(round(max(slowdown_pct))), '% slower')
    FROM stragglers WHERE flagged GROUP BY job, rank
    UNION ALL
    SELECT since, concat('node       ', host, ' ', ifNull(prev_state, '?'), ' -> ', state, ': ', any(reason))
    FROM node_states WHERE state != ifNull(prev_state, '') GROUP BY host, state, prev_state, since
    UNION ALL
    SELECT min(ts), concat('bot asked  ', any(action), ' ', any(host)) FROM drain_events GROUP BY event_id
) ORDER BY at DESC, line LIMIT 20
"""


# Rows each table holds, as any client of the store counts them.
ROWS_SQL = " UNION ALL ".join(f"SELECT '{name}', count() FROM {name}" for name in TABLES)


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return orjson.loads(r.read())
    except (OSError, ValueError):
        return None


async def fetch_store_facts(settings: CommonSettings) -> dict:
    """The sink's status and the store's headline numbers, read as any analyst reads them (the embedded store: asked
    of the sink that owns it)."""
    status = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{settings.sink_port}/status")
    facts: dict = {"sink": status}

    def ask(sql: str) -> bytes:
        return query(settings, sql, open_store=False, timeout=5)

    try:
        rows = await asyncio.to_thread(ask, ROWS_SQL)
        facts["rows"] = {name.decode(): int(n) for name, n in (line.split(b"\t") for line in rows.splitlines())}
        raw = await asyncio.to_thread(ask, FACTS_SQL)
        facts.update(zip(FACT_NAMES, (int(v) for v in raw.split(b"\t"))))
        events = await asyncio.to_thread(ask, EVENTS_SQL)
        facts["events"] = [line.split(b"\t", 1)[1].decode(errors="replace")
                           for line in events.splitlines() if b"\t" in line]
    except Exception as exc:  # the view must never take the stack down
        facts["error"] = str(exc)[:200]
    return facts


def _store_line(store: dict, error: str | None) -> str:
    """What the sink says of its store: taking writes, or waiting (for how long, on what)."""
    if store.get("waiting"):
        current = store.get("current") or {}
        return f"sink waiting {current.get('for_s', 0):.0f} s for the store ({current.get('error', '?')})"
    if error:
        return f"not answering: {error[:80]}"
    return "taking writes" + (f" ({store['outages']} outages waited out)" if store.get("outages") else "")


class StackView:
    """Rich live table on a terminal; a status line every few seconds otherwise."""

    def __init__(self, plain: bool, hosts: int):
        self.plain = plain
        self.hosts = hosts
        self.console = Console(file=sys.stderr)
        self.live: Live | None = None
        self.prev: tuple[float, dict[str, int]] | None = None
        self.last: dict = {}
        self.message = "starting"
        self.last_print = 0.0
        self.printed: set[str] = set()

    def __enter__(self):
        if not self.plain:
            self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=2,
                             transient=False, vertical_overflow="crop")
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)

    def note(self, message: str) -> None:
        self.message = message

    def update(self, ends: dict[str, int], facts: dict) -> None:
        now = time.monotonic()
        rates = {}
        if self.prev is not None and now > self.prev[0]:
            dt = now - self.prev[0]
            rates = {t: (n - self.prev[1].get(t, 0)) / dt for t, n in ends.items()}
        self.prev = (now, ends)
        sink = facts.get("sink") or {}
        tables = sink.get("tables") or {}
        installed = int(facts.get("installed") or 0)
        # The lifecycle's per-minute figure once it reports one (drained, gated, straggler and throttle losses);
        # until then, or without the stream worker, GPUs seen in the last 10 s without a critical alert.
        if facts.get("lifecycle_minutes"):
            usable, installed = facts["lifecycle_usable_ppm"] / 1e6, int(facts["lifecycle_installed"])
        else:
            usable = (int(facts.get("usable") or 0) / installed) if installed else None
        self.last = {
            "messages": ends, "rates": rates, "rows": facts.get("rows") or self.last.get("rows") or {},
            "dead_letters": sum(t["dead_letters"] for t in tables.values()),
            "store": _store_line(sink.get("store") or {}, facts.get("error")),
            "alerts_firing": facts.get("firing"), "usable_compute": usable, "installed_gpus": installed,
            **{k: facts.get(k) for k in ("interruptions", "drains", "returns", "stragglers")},
            "events": facts.get("events") or self.last.get("events") or [],
        }
        if self.live is not None:
            self.live.refresh()
        elif now - self.last_print >= 5:
            self.last_print = now
            rows = self.last["rows"].get("gpu_samples", 0)
            uc = self.last["usable_compute"]
            self.console.print(
                f"[{self.message}] samples/s={rates.get(next(iter(ends), ''), 0):.0f} gpu_samples={rows} "
                f"alerts_firing={self.last['alerts_firing']} interruptions={self.last['interruptions']} "
                f"drains={self.last['drains']} returned={self.last['returns']} stragglers={self.last['stragglers']} "
                f"usable_compute={'n/a' if uc is None else f'{uc:.1%}'} store: {self.last['store']}"
            )
            for line in reversed(self.last["events"]):
                if line not in self.printed:
                    self.printed.add(line)
                    self.console.print(f"  {line}", markup=False, highlight=False)

    def lines(self, width: int, height: int) -> list[str]:
        """The view in at most `height` lines of `width` characters: the rates and the rows compressed onto a line or
        two each, the figures, then as many of the newest events as the rest of the screen holds."""
        last = self.last
        rates = last.get("rates") or {}
        moving = [f"{short(t)} {rate:.0f}" for rate, t in sorted(  # the busiest first
            ((rates.get(t, 0), t) for t, n in (last.get("messages") or {}).items() if n), reverse=True)]
        stored = [f"{name} {rows:,}" for rows, name in sorted(
            ((rows, name) for name, rows in (last.get("rows") or {}).items() if rows), reverse=True)]
        uc = last.get("usable_compute")
        out = [f"fleetpulse — {self.hosts} hosts — {self.message}"]
        out += wrap("msg/s   ", moving, width, 2) + wrap("stored  ", stored, width, 3)
        out += [f"usable compute {'-' if uc is None else f'{uc:.1%}'} of {last.get('installed_gpus', 0)} GPUs · "
                f"alerts firing {last.get('alerts_firing') or 0} · dead letters {last.get('dead_letters', 0)}",
                f"interruptions {last.get('interruptions') or 0} · drains {last.get('drains') or 0} · returned "
                f"{last.get('returns') or 0} · stragglers {last.get('stragglers') or 0}",
                f"store: {last.get('store') or '-'}"]
        room = height - len(out) - 1
        events = (last.get("events") or [])[:max(0, room)]
        if events:
            out += ["events (newest first):"] + [f"  {e}" for e in events[:room - 1]]
        return [line[:width] for line in out[:height]]

    def _render(self) -> Text:
        size = self.console.size
        return Text("\n".join(self.lines(size.width, size.height - 1)))


def short(topic: str) -> str:
    """A topic as the view names it: its last word (fleet.telemetry.samples -> samples)."""
    return topic.rsplit(".", 1)[-1]


def wrap(head: str, items: list[str], width: int, most: int) -> list[str]:
    """`items` after `head`, ' · ' between them, on at most `most` lines of `width`; what does not fit is counted
    ("… +3")."""
    rows: list[list[str]] = [[]]
    for item in items:
        if len(head) + len(" · ".join(rows[-1] + [item])) > width and rows[-1]:
            rows.append([])
        rows[-1].append(item)
    if len(rows) > most:
        kept, left = rows[:most], sum(len(r) for r in rows[most:])
        while kept[-1] and len(head) + len(" · ".join(kept[-1])) + len(f" … +{left + 1}") > width:
            kept[-1].pop()
            left += 1
        kept[-1].append(f"… +{left}")
        rows = kept
    pad = " " * len(head)
    return [(head if k == 0 else pad) + (" · ".join(r) if r else "-") for k, r in enumerate(rows)]
