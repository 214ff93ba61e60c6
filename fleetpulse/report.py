"""`fleetpulse report`: the fleet's outcomes over a time range (fleetpulse/outcomes.py, docs/outcomes.md): usable
compute and where the rest went, interruptions per bin and cause, drain-to-return times, repeat failures after a
repair, alert noise and straggler cost. A table on the terminal, or JSON with --json."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import orjson

from core.settings import CommonSettings, load
from fleetpulse import outcomes


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="start", default=None, help="ISO time or date, UTC (default: the store's first)")
    p.add_argument("--to", dest="end", default=None,
                   help="ISO time or date, UTC, excluded (default: now, or the store's last time if later)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _when(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"fleetpulse report: {flag} {text!r} is not an ISO date or time (2026-12-06 or "
                         "2026-12-06T14:30, UTC)") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def render(r: dict) -> str:
    """The report as text for a terminal."""
    u, i, d, rep, s = r["usable_compute"], r["interruptions"], r["drains"], r["repeat_after_repair"], r["stragglers"]
    out = [f"fleetpulse report  {r['from']}  ->  {r['to']}", "",
           f"usable compute      {percent(u['gpu_weighted'])} of installed GPU-hours ({u['gpu_weighted']}; "
           f"{u['installed_gpu_hours']} GPU-h, {u['minutes']} minutes; mean of full minutes {u['full_minutes_mean']})"]
    lost = u["gpu_hours_lost"]
    out.append(f"  GPU-hours lost: {lost['drains']} to drains and repairs, {lost['faults_before_drain']} to faults "
               f"before a drain, {lost['stragglers']} to stragglers, {lost['throttling']} to throttling")
    for day in u["per_day"]:
        rest = ", ".join(f"{k} {v}" for k, v in sorted(day["breakdown"].items(), key=lambda kv: -kv[1]) if v)
        out.append(f"  {day['day']}  {day['usable_compute']}  {rest}")
    out += ["", f"interruptions       {i['total']} in {i['hours']} h (and {i['ignored']} faults binned ignore)"]
    out += [f"  {row['bin']:<8} {row['code']:<22} {row['interruptions']:>5}  MTBI {row['mtbi_h']} h, "
            f"{row['gpu_hours_between']} GPU-h between" for row in i["by_bin_and_cause"]]
    out += ["", f"drains              {d['requested']} requested on {d['hosts']} hosts; {d['returned']} returned, "
                f"{d['replaced']} to replace"]
    out.append(f"  at stake as requested: {d['gpu_hours_at_stake']} GPU-h ({d['gpu_hours_at_stake_jobs']} of jobs "
               f"stopped by {d['stopped_jobs']} drains at once; {d['after_jobs']} drains waited for their job, saving "
               f"{d['gpu_hours_saved_after_jobs']} GPU-h against stopping it)")
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
    out += ["", *(f"note: {n}" for n in r["notes"])] if r["notes"] else []
    return "\n".join(out)


def percent(share: float | None) -> str:
    """A share as every view of the figures prints it (report, page, `up`'s summary)."""
    return "not known" if share is None else f"{share * 100:.1f} %"


def build(settings: CommonSettings, start: datetime | None, end: datetime | None) -> dict:
    """Every figure of the report over [start, end) (by default the store's whole span)."""
    ask = outcomes.asker(settings)
    return outcomes.figures(ask, outcomes.resolve(ask, start, end))


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    start, end = _when(args.start, "--from"), _when(args.end, "--to")
    if start is not None and end is not None and end <= start:
        raise SystemExit(f"fleetpulse report: --to {args.end} is not after --from {args.start}: give --from first")
    report = build(settings, start, end)
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n" if args.json
                     else render(report) + "\n")
    return 0
