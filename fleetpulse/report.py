"""`fleetpulse report`: the fleet's outcomes over a time range, from the store's views (docs/outcomes.md): usable
compute and where the rest went, interruptions per bin and cause, drain-to-return times, repeat failures after a
repair, alert noise and straggler cost. A table on the terminal, or JSON with --json."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import orjson

from core.settings import CommonSettings, load
from fleetpulse.query import query

REPEAT_WITHIN_DAYS = 7


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="start", default=None, help="ISO time or date, UTC (default: the store's first)")
    p.add_argument("--to", dest="end", default=None,
                   help="ISO time or date, UTC, excluded (default: now, or the store's last time if later)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _when(text: str | None, default: datetime) -> datetime:
    if text is None:
        return default
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"fleetpulse report: not an ISO date or time: {text!r}") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _rows(settings: CommonSettings, sql: str) -> list[dict]:
    return orjson.loads(query(settings, f"{sql}\nFORMAT JSON"))["data"]


def _quantiles(settings: CommonSettings, expr: str, source: str) -> dict:
    row = _rows(settings, f"SELECT count() AS n, quantileExactInclusive(0.5)({expr}) AS p50, "
                          f"quantileExactInclusive(0.95)({expr}) AS p95 "
                          f"FROM ({source}) WHERE ({expr}) IS NOT NULL")[0]
    n = int(row["n"])
    return {"n": n, "p50_s": round(float(row["p50"]), 1) if n else None,
            "p95_s": round(float(row["p95"]), 1) if n else None}


def build(settings: CommonSettings, start: datetime | None, end: datetime | None) -> dict:
    """Every figure of the report over [start, end) (the store's whole span when start is None)."""
    span = _rows(settings, """
        SELECT toUnixTimestamp64Milli(min(minute_ts)) AS first,
               greatest(toUnixTimestamp64Milli(max(minute_ts)) + 60000,
                        (SELECT toUnixTimestamp64Milli(max(ts)) + 1 FROM drain_events),
                        (SELECT toUnixTimestamp64Milli(max(since)) + 1 FROM node_states)) AS last
        FROM usable_compute""")[0]
    now = datetime.now(timezone.utc)
    if start is None:
        start = datetime.fromtimestamp(int(span["first"]) / 1000, timezone.utc) if int(span["first"]) else now
    if end is None:  # now, or later where the store holds later times (a simulated run ahead of the clock)
        end = max(now, datetime.fromtimestamp(int(span["last"]) / 1000, timezone.utc))
    a, b = (f"toDateTime64('{t:%Y-%m-%d %H:%M:%S.%f}', 3, 'UTC')" for t in (start, end))
    in_range = f"BETWEEN {a} AND {b} - toIntervalMillisecond(1)"

    minutes = _rows(settings, f"""
        SELECT count() AS minutes, sum(usable_gpus) / sum(installed_gpus) AS gpu_weighted,
               avgIf(usable_compute, nodes = (SELECT max(nodes) FROM usable_compute WHERE minute_ts {in_range}))
                   AS full_minutes_mean,
               sum(installed_gpus) / 60 AS installed_gpu_hours
        FROM (SELECT minute_ts, any(nodes) AS nodes, any(usable_compute) AS usable_compute,
                     any(installed_gpus) AS installed_gpus, any(usable_gpus) AS usable_gpus
              FROM usable_compute WHERE scope = 'fleet' AND minute_ts {in_range} GROUP BY minute_ts)""")[0]
    gpu_hours = float(minutes["installed_gpu_hours"] or 0.0)
    days = _rows(settings, f"SELECT day, minutes, nodes, round(usable_compute, 4) AS usable_compute, "
                           f"mapApply((k, v) -> (k, round(v, 4)), breakdown) AS breakdown FROM usable_compute_1d "
                           f"WHERE day BETWEEN toDate({a}) AND toDate({b} - toIntervalMillisecond(1)) ORDER BY day")
    hours = (end - start).total_seconds() / 3600

    bins = _rows(settings, f"SELECT bin, code, count() AS interruptions FROM interruptions WHERE ts {in_range} "
                           "GROUP BY bin, code ORDER BY interruptions DESC, bin, code")
    for row in bins:
        n = int(row["interruptions"])
        row["mtbi_h"] = round(hours / n, 4)
        row["gpu_hours_between"] = round(gpu_hours / n, 1) if gpu_hours else None

    episodes = f"""SELECT e.*, toFloat64(i.ts) AS fault_ts FROM node_episodes AS e
                   LEFT JOIN interruptions AS i ON e.fault_id = i.fault_id WHERE e.drain_at {in_range}
                   SETTINGS join_use_nulls = 1"""
    times = {
        "fault_to_drain_requested": _quantiles(settings, "toFloat64(drain_at) - fault_ts", episodes),
        "drain_requested_to_repaired": _quantiles(settings, "toFloat64(validating_at) - toFloat64(drain_at)", episodes),
        "validating_to_returned": _quantiles(settings, "toFloat64(returned_at) - toFloat64(validating_at)", episodes),
    }
    drains = _rows(settings, f"SELECT uniqExact(event_id) AS requested, uniqExact(host) AS hosts FROM drain_events "
                             f"WHERE action = 'drain' AND ts {in_range}")[0]
    counts = _rows(settings, f"SELECT count() AS episodes, countIf(returned_at IS NOT NULL) AS returned, "
                             f"countIf(replace_at IS NOT NULL) AS replaced FROM ({episodes})")[0]

    repeats = _rows(settings, f"""
        SELECT host, count() AS returns, countIf(next_drain IS NOT NULL
                   AND next_drain <= returned_at + toIntervalDay({REPEAT_WITHIN_DAYS})) AS failed_again
        FROM (SELECT host, returned_at,
                     leadInFrame(drain_at) OVER (PARTITION BY host ORDER BY episode
                                                 ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_drain_raw,
                     if(next_drain_raw = toDateTime64(0, 3, 'UTC'), NULL, next_drain_raw) AS next_drain
              FROM node_episodes)
        WHERE returned_at {in_range}
        GROUP BY host ORDER BY failed_again DESC, returns DESC, host""")
    offenders = _rows(settings, f"""
        SELECT host, toFloat64(ts) AS drained_at, evidence['recurring_repair'] AS repair,
               toUInt32OrZero(evidence['recurrence']) AS drains, evidence['returned_at'] AS returned_at
        FROM drain_events WHERE action = 'drain' AND evidence['recurrence'] != '' AND ts {in_range}
        ORDER BY ts LIMIT 1 BY event_id""")
    returns = sum(int(r["returns"]) for r in repeats)
    again = sum(int(r["failed_again"]) for r in repeats)

    gpu_days = gpu_hours / 24
    alerts = _rows(settings, f"SELECT alertname, any(severity) AS severity, sum(fired) AS fired FROM alerts_1d "
                             f"WHERE day BETWEEN toDate({a}) AND toDate({b} - toIntervalMillisecond(1)) "
                             "GROUP BY alertname ORDER BY fired DESC, alertname")
    for row in alerts:
        row["per_1000_gpu_days"] = round(int(row["fired"]) / (gpu_days / 1000), 2) if gpu_days else None
    # Pages: firings (openings and escalations) of alerts that are no incident's condition, info left out.
    pages = _rows(settings, f"SELECT alertname, uniqExact(fingerprint, ts) AS pages FROM alerts "
                            f"WHERE status = 'firing' AND labels['incident'] = '' AND severity != 'info' "
                            f"AND ts {in_range} GROUP BY alertname ORDER BY pages DESC, alertname")
    paged = sum(int(r["pages"]) for r in pages)

    stragglers = _rows(settings, f"""
        SELECT count() AS windows_flagged, uniqExact(job) AS jobs,
               arraySort(groupUniqArrayArray(hosts_flagged)) AS hosts,
               round(sum(dateDiff('millisecond', window_start, window_end) / 1000 * job_slowdown_pct / 100), 1)
                   AS job_seconds_lost
        FROM job_windows WHERE ranks_flagged > 0 AND window_start {in_range}""")[0]

    return {
        "from": start.isoformat(), "to": end.isoformat(),
        "usable_compute": {"minutes": int(minutes["minutes"]), "installed_gpu_hours": round(gpu_hours, 1),
                           "gpu_weighted": _round(minutes["gpu_weighted"]),
                           "full_minutes_mean": _round(minutes["full_minutes_mean"]), "per_day": days},
        "interruptions": {"total": sum(int(r["interruptions"]) for r in bins if r["bin"] != "ignore"),
                          "ignored": sum(int(r["interruptions"]) for r in bins if r["bin"] == "ignore"),
                          "hours": round(hours, 2), "by_bin_and_cause": bins},
        "drains": {"requested": int(drains["requested"]), "hosts": int(drains["hosts"]),
                   "episodes": int(counts["episodes"]), "returned": int(counts["returned"]),
                   "replaced": int(counts["replaced"]), "times": times},
        "repeat_after_repair": {"within_days": REPEAT_WITHIN_DAYS, "returns": returns, "failed_again": again,
                                "share": round(again / returns, 4) if returns else None,
                                "worst": [r for r in repeats if int(r["failed_again"])][:10],
                                "sent_to_replace": [{**o, "drains": int(o["drains"])} for o in offenders]},
        "alerts": {"gpu_days": round(gpu_days, 2), "by_name": alerts, "pages": paged,
                   "pages_by_name": {r["alertname"]: int(r["pages"]) for r in pages},
                   "pages_per_1000_gpu_days": round(paged / (gpu_days / 1000), 2) if gpu_days else None},
        "stragglers": {**stragglers, "windows_flagged": int(stragglers["windows_flagged"]),
                       "jobs": int(stragglers["jobs"]), "job_seconds_lost": float(stragglers["job_seconds_lost"] or 0)},
    }


def _round(value) -> float | None:
    return None if value is None or value != value else round(float(value), 4)


def render(r: dict) -> str:
    """The report as text for a terminal."""
    u, i, d, rep, s = r["usable_compute"], r["interruptions"], r["drains"], r["repeat_after_repair"], r["stragglers"]
    out = [f"fleetpulse report  {r['from']}  ->  {r['to']}", "",
           f"usable compute      {u['gpu_weighted']} of installed GPU-hours ({u['installed_gpu_hours']} GPU-h, "
           f"{u['minutes']} minutes; mean of full minutes {u['full_minutes_mean']})"]
    for day in u["per_day"]:
        rest = ", ".join(f"{k} {v}" for k, v in sorted(day["breakdown"].items(), key=lambda kv: -kv[1]) if v)
        out.append(f"  {day['day']}  {day['usable_compute']}  {rest}")
    out += ["", f"interruptions       {i['total']} in {i['hours']} h (and {i['ignored']} faults binned ignore)"]
    out += [f"  {row['bin']:<8} {row['code']:<22} {row['interruptions']:>5}  MTBI {row['mtbi_h']} h, "
            f"{row['gpu_hours_between']} GPU-h between" for row in i["by_bin_and_cause"]]
    out += ["", f"drains              {d['requested']} requested on {d['hosts']} hosts; {d['returned']} returned, "
                f"{d['replaced']} to replace"]
    out += [f"  {name:<28} p50 {t['p50_s']} s  p95 {t['p95_s']} s  (n={t['n']})" for name, t in d["times"].items()]
    out += ["", f"repeat after repair {rep['failed_again']} of {rep['returns']} returns failed again within "
                f"{rep['within_days']} days"]
    out += [f"  {w['host']}: {w['failed_again']} of {w['returns']}" for w in rep["worst"]]
    out += [f"  {o['host']}: sent to replace at {o['drained_at']:.0f}, drain {o['drains']} for {o['repair']} "
            f"(returned at {o['returned_at']})" for o in rep["sent_to_replace"]]
    out += ["", f"alerts              per 1,000 GPU-days ({r['alerts']['gpu_days']} GPU-days); "
                f"{r['alerts']['pages']} pages ({r['alerts']['pages_per_1000_gpu_days']} per 1,000 GPU-days)"]
    out += [f"  {a['alertname']:<28} {a['severity']:<9} {a['fired']:>5} fired  {a['per_1000_gpu_days']}"
            for a in r["alerts"]["by_name"]]
    out += ["", f"stragglers          {s['windows_flagged']} windows flagged in {s['jobs']} jobs, "
                f"{s['job_seconds_lost']} job-seconds lost; hosts {', '.join(s['hosts']) or '-'}"]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    report = build(settings, _when(args.start, None), _when(args.end, None))
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n" if args.json
                     else render(report) + "\n")
    return 0
