"""`fleetpulse simulate`: argument parsing and the run that prints its report as JSON."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

from agents.publisher import Publisher
from agents.simulator.simulate import Tick, simulate
from agents.simulator.scenario import RUN_DEFAULTS, RunPlan, Scenario, available, load_scenario
from core.errors import FleetpulseError
from core.settings import CommonSettings, load

PROGRESS_EVERY_S = 5.0


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags left out take the scenario's fleet/run blocks, then the defaults in brackets (scenario.RUN_DEFAULTS)."""
    d = RUN_DEFAULTS
    p.add_argument("--hosts", type=int, default=None, help=f"hosts to simulate, 8 GPUs each (default {d['hosts']})")
    p.add_argument("--duration", type=float, default=None,
                   help=f"simulated seconds to run (default {d['duration_s']:g})")
    p.add_argument("--seed", type=int, default=None,
                   help=f"random seed; equal seeds give equal telemetry (default {d['seed']})")
    p.add_argument("--scenario", default=None,
                   help=f"scenario file, or a shipped one: {', '.join(available())} (default: no faults)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="1 = real time on the wall clock, N = N times faster, 0 = as fast as possible")
    p.add_argument("--interval", type=float, default=None,
                   help=f"seconds between a host's samples (default {d['interval_s']:g})")
    p.add_argument("--nccl-interval", type=float, default=None,
                   help="simulated seconds between one rank's NCCL records; 0 = none "
                        f"(default {d['nccl_interval_s']:g})")
    p.add_argument("--follow-repairs", action="store_true",
                   help="mend a host when a remediation bot reports its repair (fleetpulse up's simulated bot)")
    return p


def _progress(every: float = PROGRESS_EVERY_S):
    last = [time.monotonic()]

    def report(tick: Tick, pub: Publisher) -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            sent = ", ".join(f"{name.rsplit('.', 1)[-1]}={n}" for name, n in sorted(pub.sent.items()))
            print(f"simulate: tick {tick.index + 1} ts={tick.ts:.0f} delivered {sent}", file=sys.stderr, flush=True)

    return report


async def _run(args: argparse.Namespace, settings: CommonSettings, scenario: Scenario, plan: RunPlan) -> str:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    report = await simulate(settings, hosts=plan.hosts, duration=plan.duration_s, seed=plan.seed, scenario=scenario,
                            speed=args.speed, interval=plan.interval_s, stop=stop,
                            nccl_interval=plan.nccl_interval_s, on_tick=_progress(),
                            follow_repairs=args.follow_repairs)
    return report.model_dump_json(indent=2)


def _out_of_range(args: argparse.Namespace) -> bool:
    def bad(value, low, strict: bool) -> bool:
        return value is not None and (value <= low if strict else value < low)

    return (bad(args.hosts, 1, False) or bad(args.duration, 0, True) or bad(args.interval, 0, True)
            or bad(args.speed, 0, False) or bad(args.nccl_interval, 0, False))


def run(args: argparse.Namespace) -> int:
    """Run the simulator; the report goes to stdout as JSON, progress and errors to stderr."""
    if _out_of_range(args):
        print("simulate: --hosts >= 1, --duration > 0, --interval > 0, --speed >= 0, --nccl-interval >= 0",
              file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario)
        plan = scenario.plan(hosts=args.hosts, duration_s=args.duration, interval_s=args.interval,
                             nccl_interval_s=args.nccl_interval, seed=args.seed)
        settings = load(CommonSettings)
        print(f"simulate: {plan.hosts} hosts x 8 GPUs, {plan.duration_s:g}s at speed {args.speed:g} "
              f"-> {settings.bootstrap} (prefix {settings.topic_prefix!r})", file=sys.stderr, flush=True)
        print(asyncio.run(_run(args, settings, scenario, plan)))
    except FleetpulseError as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = configure_parser(argparse.ArgumentParser(prog="fleetpulse simulate", description=__doc__))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
