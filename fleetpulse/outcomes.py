"""The fleet's outcomes over a range, from one set of named queries: usable compute and where the rest went,
interruptions (one per fault, however many lines and codes it logged), drains and returns with their times, repeat
failures after a repair, alert and page rates, straggler cost (docs/outcomes.md).

`fleetpulse report`, the fleet page's headline, `up`'s summary and `fleetpulse evaluate` all call `figures`, so they
print the same numbers for the same range. The range rules are here too, once:
- events (faults, drains, alerts, returns) count when they happen in [start, end);
- a usable-compute minute counts when it overlaps the range (the minute holding `start` is in: a range that starts a
  few seconds into a minute still sees that minute's drain);
- by default the range runs from the store's first outcome to its last (or now, where now is later);
- a reversed or empty range is refused; a range with no minute yet, or rates drawn from a small exposure, say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import orjson

from core.errors import ConfigError
from core.settings import CommonSettings
from fleetpulse.query import query

REPEAT_WITHIN_DAYS = 7
# Where the GPU-hours that were not usable went, by the lifecycle's buckets (streams/lifecycle/usable_compute.py): out
# of service for a drain and its repair, held back by a fault before any drain (gated by a hard gate, or a GPU gone),
# and slowed (a straggler's share, throttling).
LOSSES = {"drains": ("drained", "validating", "replace"), "faults_before_drain": ("gated", "lost"),
          "stragglers": ("straggler_loss",), "throttling": ("throttled",)}
RATE_PER_GPU_DAYS = 1000  # alert rates are per 1,000 GPU-days
Ask = Callable[[str], list[dict]]


class RangeError(ConfigError):
    """A range that cannot hold anything: its end is not after its start."""


@dataclass(frozen=True)
class Range:
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise RangeError(f"the range ends ({self.end.isoformat()}) before it starts ({self.start.isoformat()}): "
                             "give --from before --to")

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    def bounds(self) -> tuple[str, str]:
        """The range's ends as ClickHouse DateTime64 expressions."""
        return tuple(f"toDateTime64('{t.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S.%f}', 3, 'UTC')"
                     for t in (self.start, self.end))


def events_in(column: str, lo: str, hi: str) -> str:
    """The rule for events: they happen inside [lo, hi)."""
    return f"{column} >= {lo} AND {column} < {hi}"


def minutes_in(column: str, lo: str, hi: str) -> str:
    """The rule for per-minute rows: the minute [m, m + 60 s) overlaps [lo, hi)."""
    return f"{column} > {lo} - toIntervalMinute(1) AND {column} < {hi}"


# The fleet's minutes in the range, each once (a minute re-delivered by a restarted worker has the same figures).
FLEET_MINUTES = """SELECT minute_ts, any(nodes) AS nodes, any(usable_gpus) AS usable_gpus,
       any(installed_gpus) AS installed_gpus, any(breakdown_gpus) AS breakdown_gpus
FROM usable_compute WHERE scope = 'fleet' AND {minutes} GROUP BY minute_ts"""

USABLE_COMPUTE = f"""SELECT count() AS minutes, sum(usable_gpus) / sum(installed_gpus) AS gpu_weighted,
       avgIf(usable_gpus / installed_gpus, nodes = (SELECT max(nodes) FROM ({FLEET_MINUTES}))) AS full_minutes_mean,
       sum(installed_gpus) / 60 AS installed_gpu_hours, sum(usable_gpus) / 60 AS usable_gpu_hours,
       mapApply((k, v) -> (k, v / sum(installed_gpus)), sumMap(breakdown_gpus)) AS breakdown,
       mapApply((k, v) -> (k, v / 60), sumMap(breakdown_gpus)) AS lost_gpu_hours
FROM ({FLEET_MINUTES})"""

USABLE_COMPUTE_PER_DAY = f"""SELECT toString(toDate(minute_ts)) AS day, count() AS minutes, max(nodes) AS nodes,
       round(sum(usable_gpus) / sum(installed_gpus), 4) AS usable_compute,
       mapApply((k, v) -> (k, round(v / sum(installed_gpus), 4)), sumMap(breakdown_gpus)) AS breakdown
FROM ({FLEET_MINUTES}) GROUP BY day ORDER BY day"""

INTERRUPTIONS = """SELECT bin, code, count() AS interruptions FROM interruptions WHERE {events_ts}
GROUP BY bin, code ORDER BY interruptions DESC, bin, code"""

# Drain episodes that began in the range, with the time their fault began (any of the interruption's faults).
EPISODES = """SELECT e.*, toFloat64(i.ts) AS fault_ts FROM node_episodes AS e
LEFT JOIN (SELECT arrayJoin(fault_ids) AS fault_id, ts FROM interruptions) AS i ON e.fault_id = i.fault_id
WHERE {events_drain_at} SETTINGS join_use_nulls = 1"""

TIMES = {"fault_to_drain_requested": "toFloat64(drain_at) - fault_ts",
         "drain_requested_to_repaired": "toFloat64(validating_at) - toFloat64(drain_at)",
         "validating_to_returned": "toFloat64(returned_at) - toFloat64(validating_at)"}

# What each drain request estimated it put at stake (streams/lifecycle/cost.py), once per request however often sent.
DRAINS = """SELECT count() AS requested, uniqExact(host) AS hosts, sum(at_stake) AS gpu_hours_at_stake,
       sum(at_stake_job) AS gpu_hours_at_stake_jobs, countIf(stops) AS stopped_jobs,
       countIf(mode = 'after_jobs') AS after_jobs, sum(saved) AS gpu_hours_saved_after_jobs
FROM (SELECT event_id, any(host) AS host, any(toFloat64OrZero(evidence['cost.gpu_hours'])) AS at_stake,
             any(toFloat64OrZero(evidence['cost.gpu_hours_job'])) AS at_stake_job,
             any(toFloat64OrZero(evidence['cost.gpu_hours_saved'])) AS saved,
             any(toUInt32OrZero(evidence['cost.ranks_stopped']) > 0) AS stops, any(evidence['mode']) AS mode
      FROM drain_events WHERE action = 'drain' AND {events_ts} GROUP BY event_id)"""

# Returns count when they happen in the range, whenever their drain began.
RETURNS = """SELECT count() AS returned FROM node_episodes WHERE {events_returned_at}"""

EPISODE_COUNTS = f"""SELECT count() AS episodes, countIf(replace_at IS NOT NULL) AS replaced FROM ({EPISODES})"""

REPEATS = f"""SELECT host, count() AS returns, countIf(next_drain IS NOT NULL
           AND next_drain <= returned_at + toIntervalDay({REPEAT_WITHIN_DAYS})) AS failed_again
FROM (SELECT host, returned_at,
             leadInFrame(drain_at) OVER (PARTITION BY host ORDER BY episode
                                         ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_drain_raw,
             if(next_drain_raw = toDateTime64(0, 3, 'UTC'), NULL, next_drain_raw) AS next_drain
      FROM node_episodes)
WHERE {{events_returned_at}}
GROUP BY host ORDER BY failed_again DESC, returns DESC, host"""

SENT_TO_REPLACE = """SELECT host, toFloat64(ts) AS drained_at, evidence['recurring_repair'] AS repair,
       toUInt32OrZero(evidence['recurrence']) AS drains, evidence['returned_at'] AS returned_at
FROM drain_events WHERE action = 'drain' AND evidence['recurrence'] != '' AND {events_ts}
ORDER BY ts LIMIT 1 BY event_id"""

ALERTS = """SELECT alertname, any(severity) AS severity, uniqExact(fingerprint, starts_at) AS fired FROM alerts
WHERE status = 'firing' AND {events_starts_at} GROUP BY alertname ORDER BY fired DESC, alertname"""

# Pages: firings (openings and escalations) of alerts that are no incident's condition, info left out.
PAGES = """SELECT alertname, uniqExact(fingerprint, ts) AS pages FROM alerts
WHERE status = 'firing' AND labels['incident'] = '' AND severity != 'info' AND {events_ts}
GROUP BY alertname ORDER BY pages DESC, alertname"""

STRAGGLERS = """SELECT count() AS windows_flagged, uniqExact(job) AS jobs,
       arraySort(groupUniqArrayArray(hosts_flagged)) AS hosts,
       round(sum(dateDiff('millisecond', window_start, window_end) / 1000 * job_slowdown_pct / 100), 1)
           AS job_seconds_lost
FROM job_windows WHERE ranks_flagged > 0 AND {events_window_start}"""

# The store's first and last outcome: the default range, and what an empty range is told.
SPAN = """SELECT least(ifNull((SELECT minOrNull(minute_ts) FROM usable_compute), far),
                ifNull((SELECT minOrNull(first_ts) FROM faults), far),
                ifNull((SELECT minOrNull(since) FROM node_states), far),
                ifNull((SELECT minOrNull(starts_at) FROM alerts), far),
                ifNull((SELECT minOrNull(window_start) FROM stragglers), far)) AS first_at,
       greatest(ifNull((SELECT maxOrNull(minute_ts) + toIntervalMinute(1) FROM usable_compute), near),
                ifNull((SELECT maxOrNull(ts) + toIntervalMillisecond(1) FROM faults), near),
                ifNull((SELECT maxOrNull(ts) + toIntervalMillisecond(1) FROM drain_events), near),
                ifNull((SELECT maxOrNull(since) + toIntervalMillisecond(1) FROM node_states), near),
                ifNull((SELECT maxOrNull(starts_at) + toIntervalMillisecond(1) FROM alerts), near),
                ifNull((SELECT maxOrNull(window_start) + toIntervalMillisecond(1) FROM stragglers), near)) AS last_at,
       toUnixTimestamp64Milli(first_at) AS first, toUnixTimestamp64Milli(last_at) AS last
FROM (SELECT toDateTime64('2100-01-01 00:00:00', 3, 'UTC') AS far, toDateTime64(0, 3, 'UTC') AS near)"""

# The named queries, as `fleetpulse/panels.py` and docs/outcomes.md show them.
QUERIES = {"usable_compute": USABLE_COMPUTE, "usable_compute_per_day": USABLE_COMPUTE_PER_DAY,
           "interruptions": INTERRUPTIONS, "drains": DRAINS, "returns": RETURNS, "episodes": EPISODE_COUNTS,
           "repeats": REPEATS, "sent_to_replace": SENT_TO_REPLACE, "alerts": ALERTS, "pages": PAGES,
           "stragglers": STRAGGLERS}


def sql(name_or_text: str, lo: str, hi: str) -> str:
    """A named query (or one of the templates above) for the range [lo, hi), each an SQL time expression: literal
    times for the report, Grafana's `$__fromTime_ms`/`$__toTime_ms` for the dashboard."""
    text = QUERIES.get(name_or_text, name_or_text)
    return text.format(minutes=minutes_in("minute_ts", lo, hi), events_ts=events_in("ts", lo, hi),
                       events_drain_at=events_in("drain_at", lo, hi),
                       events_returned_at=events_in("returned_at", lo, hi),
                       events_starts_at=events_in("starts_at", lo, hi),
                       events_window_start=events_in("window_start", lo, hi))


def asker(settings: CommonSettings, **how) -> Ask:
    """Rows of a statement as dicts, read where `fleetpulse query` reads (as the analyst, or through the sink)."""
    return lambda text: orjson.loads(query(settings, f"{text}\nFORMAT JSON", **how))["data"]


def span(ask: Ask) -> tuple[datetime, datetime] | None:
    """The store's first and last outcome (last: just after the newest), or None while it holds none."""
    row = ask(SPAN)[0]
    first, last = int(row["first"]), int(row["last"])
    if last <= 0 or first >= last:
        return None
    return tuple(datetime.fromtimestamp(t / 1000, timezone.utc) for t in (first, last))


def resolve(ask: Ask, start: datetime | None, end: datetime | None, now: datetime | None = None) -> Range:
    """The range a caller meant: a missing start is the store's first outcome; a missing end is now, or the store's
    last outcome where that is later (a simulated fleet can run ahead of the clock)."""
    now = now or datetime.now(timezone.utc)
    held = span(ask) if start is None or end is None else None
    if end is None:
        end = max(now, held[1]) if held else now
    if start is None:  # before anything is stored: an instant, which `notes` says holds nothing
        start = min(held[0], end - _MS) if held else end - _MS
    return Range(start, end)


_MS = timedelta(milliseconds=1)


def _round(value) -> float | None:
    return None if value is None or value != value else round(float(value), 4)


def _quantiles(ask: Ask, expr: str, source: str) -> dict:
    row = ask(f"SELECT count() AS n, quantileExactInclusive(0.5)({expr}) AS p50, "
              f"quantileExactInclusive(0.95)({expr}) AS p95 FROM ({source}) WHERE ({expr}) IS NOT NULL")[0]
    n = int(row["n"])
    return {"n": n, "p50_s": round(float(row["p50"]), 1) if n else None,
            "p95_s": round(float(row["p95"]), 1) if n else None}


def per_gpu_days(count: int, gpu_days: float) -> float | None:
    return round(count / (gpu_days / RATE_PER_GPU_DAYS), 2) if gpu_days else None


def figures(ask: Ask, rng: Range) -> dict:
    """Every outcome over the range, with `notes` saying what a reader must know to read them (an empty range, no
    minute yet, rates drawn from a small exposure)."""
    lo, hi = rng.bounds()

    def rows(name: str) -> list[dict]:
        return ask(sql(name, lo, hi))

    u = rows("usable_compute")[0]
    minutes = int(u["minutes"])
    gpu_hours = float(u["installed_gpu_hours"] or 0.0) if minutes else 0.0
    gpu_days = gpu_hours / 24

    bins = rows("interruptions")
    for row in bins:
        n = int(row["interruptions"])
        row["interruptions"] = n
        row["mtbi_h"] = round(rng.hours / n, 4)
        row["gpu_hours_between"] = round(gpu_hours / n, 1) if gpu_hours else None

    episodes = sql(EPISODES, lo, hi)
    times = {name: _quantiles(ask, expr, episodes) for name, expr in TIMES.items()}
    drains, counts, returned = rows("drains")[0], rows("episodes")[0], rows("returns")[0]

    repeats = rows("repeats")
    for row in repeats:
        row["returns"], row["failed_again"] = int(row["returns"]), int(row["failed_again"])
    offenders = [{**o, "drains": int(o["drains"])} for o in rows("sent_to_replace")]
    returns = sum(r["returns"] for r in repeats)
    again = sum(r["failed_again"] for r in repeats)

    alerts = rows("alerts")
    for row in alerts:
        row["fired"] = int(row["fired"])
        row["per_1000_gpu_days"] = per_gpu_days(row["fired"], gpu_days)
    pages = rows("pages")
    paged = sum(int(r["pages"]) for r in pages)

    s = rows("stragglers")[0]
    out = {
        "from": rng.start.isoformat(), "to": rng.end.isoformat(),
        "usable_compute": {"minutes": minutes, "installed_gpu_hours": round(gpu_hours, 1),
                           "usable_gpu_hours": round(float(u["usable_gpu_hours"] or 0.0), 1) if minutes else 0.0,
                           "gpu_weighted": _round(u["gpu_weighted"]) if minutes else None,
                           "full_minutes_mean": _round(u["full_minutes_mean"]) if minutes else None,
                           "breakdown": {k: round(float(v), 4) for k, v in (u["breakdown"] or {}).items() if v},
                           "gpu_hours_lost": {name: round(sum(float((u["lost_gpu_hours"] or {}).get(b, 0.0))
                                                               for b in buckets), 2) if minutes else 0.0
                                              for name, buckets in LOSSES.items()},
                           "per_day": rows("usable_compute_per_day")},
        "interruptions": {"total": sum(r["interruptions"] for r in bins if r["bin"] != "ignore"),
                          "ignored": sum(r["interruptions"] for r in bins if r["bin"] == "ignore"),
                          "hours": round(rng.hours, 2), "by_bin_and_cause": bins},
        "drains": {"requested": int(drains["requested"]), "hosts": int(drains["hosts"]),
                   "gpu_hours_at_stake": round(float(drains["gpu_hours_at_stake"] or 0.0), 1),
                   "gpu_hours_at_stake_jobs": round(float(drains["gpu_hours_at_stake_jobs"] or 0.0), 1),
                   "stopped_jobs": int(drains["stopped_jobs"]), "after_jobs": int(drains["after_jobs"]),
                   "gpu_hours_saved_after_jobs": round(float(drains["gpu_hours_saved_after_jobs"] or 0.0), 1),
                   "episodes": int(counts["episodes"]), "returned": int(returned["returned"]),
                   "replaced": int(counts["replaced"]), "times": times},
        "repeat_after_repair": {"within_days": REPEAT_WITHIN_DAYS, "returns": returns, "failed_again": again,
                                "share": round(again / returns, 4) if returns else None,
                                "worst": [r for r in repeats if r["failed_again"]][:10],
                                "sent_to_replace": offenders},
        "alerts": {"gpu_days": round(gpu_days, 2), "by_name": alerts, "pages": paged,
                   "pages_by_name": {r["alertname"]: int(r["pages"]) for r in pages},
                   "pages_per_1000_gpu_days": per_gpu_days(paged, gpu_days)},
        "stragglers": {**s, "windows_flagged": int(s["windows_flagged"]), "jobs": int(s["jobs"]),
                       "job_seconds_lost": float(s["job_seconds_lost"] or 0)},
    }
    out["notes"] = notes(out, ask)
    return out


def notes(r: dict, ask: Ask) -> list[str]:
    """What the figures cannot say by themselves."""
    said = []
    u, events = r["usable_compute"], (r["interruptions"]["total"] + r["interruptions"]["ignored"]
                                      + r["drains"]["requested"] + r["drains"]["returned"] + len(r["alerts"]["by_name"]))
    if not u["minutes"] and not events:
        held = span(ask)
        said.append("nothing is stored in this range" + (
            f"; the store holds {held[0]:%Y-%m-%d %H:%M:%S} to {held[1]:%Y-%m-%d %H:%M:%S} UTC" if held else
            ": the store holds no outcomes yet (`./dev up` stores a run)"))
    elif not u["minutes"]:
        said.append("no usable-compute minute in this range yet: the lifecycle stage reports a minute once it is "
                    "over (and at stop), so usable compute is not known for it")
    gpu_days = r["alerts"]["gpu_days"]
    if r["alerts"]["by_name"] and 0 < gpu_days < RATE_PER_GPU_DAYS / 10:
        said.append(f"alert rates per 1,000 GPU-days are extrapolated from {gpu_days:g} GPU-days "
                    f"(x{RATE_PER_GPU_DAYS / gpu_days:,.0f}): read the counts")
    return said
