"""`fleetpulse evaluate --scenario NAME_OR_FILE`: the JSON report on stdout, progress on stderr."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from fleetpulse.evaluate.plan import plan_from
from fleetpulse.evaluate.evaluation import Evaluation, Progress, write_report
from core.settings import CommonSettings, load


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help="shipped scenario name (e.g. straggler) or a JSON file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="change the scenario before it runs: dotted path, JSON value "
                        "(faults.0.slowdown_pct=20, fleet.hosts=256, run.duration_s=600); repeatable")
    p.add_argument("--seed", type=int, default=None, help="simulator seed (default: the scenario's, else 0)")
    p.add_argument("--max-lag", type=int, default=None,
                   help="records the stream worker may still owe when the next tick goes out "
                        "(default: a quarter tick, at least 200)")
    p.add_argument("--speed", type=float, default=None,
                   help="at most this many simulated seconds per wall second (1 = a real fleet's pace); "
                        "default 0: as fast as the worker follows")
    p.add_argument("--kill-worker-at", type=float, default=None, metavar="SECONDS",
                   help="kill -9 the stream worker at this simulated time and start a new one")
    p.add_argument("--settle", type=float, default=120.0, help="seconds to wait for the pipeline after the last tick")
    p.add_argument("--keep-topics", action="store_true",
                   help="keep the run's Kafka topics (default: deleted once scored; the database always stays)")
    p.add_argument("--keep-broker", action="store_true",
                   help="leave the local Kafka broker running if this run started it (default: stopped at the end)")
    p.add_argument("--keep-store", action="store_true",
                   help="leave the local ClickHouse server running if this run started it (default: stopped at the "
                        "end; its rows stay, `fleetpulse clickhouse start` serves them again)")
    p.add_argument("--output", type=Path, default=None, help="also write the report to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    plan = plan_from(args.scenario, args.overrides, seed=args.seed, max_lag=args.max_lag,
                     kill_worker_at=args.kill_worker_at, settle_s=args.settle, speed=args.speed,
                     keep_topics=args.keep_topics or None, keep_broker=args.keep_broker or None,
                     keep_store=args.keep_store or None)
    report = asyncio.run(Evaluation(settings, plan, progress=Progress(quiet=args.quiet)).run())
    write_report(report, args.output)
    return 0
