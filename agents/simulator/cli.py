"""`fleetpulse simulate`: argument parsing and the run that prints its report as JSON."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

from agents.publisher import Publisher
from agents.simulator.runner import Tick, simulate
from agents.simulator.scenario import available
from fleetpulse.errors import FleetpulseError
from fleetpulse.settings import CommonSettings, load

PROGRESS_EVERY_S = 5.0


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--hosts", type=int, default=16, help="hosts to simulate, 8 GPUs each (default 16)")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds to run (default 60)")
    p.add_argument("--seed", type=int, default=0, help="random seed; equal seeds give equal telemetry")
    p.add_argument("--scenario", default=None,
                   help=f"scenario file, or a shipped one: {', '.join(available())} (default: no faults)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="1 = real time on the wall clock, N = N times faster, 0 = as fast as possible")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a host's samples (default 1)")
    p.add_argument("--nccl-interval", type=float, default=1.0,
                   help="simulated seconds between one rank's NCCL records; 0 = none (default 1)")
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


async def _run(args: argparse.Namespace, settings: CommonSettings) -> str:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    report = await simulate(settings, hosts=args.hosts, duration=args.duration, seed=args.seed,
                            scenario=args.scenario, speed=args.speed, interval=args.interval, stop=stop,
                            nccl_interval=args.nccl_interval, on_tick=_progress())
    return report.model_dump_json(indent=2)


def run(args: argparse.Namespace) -> int:
    """Run the simulator; the report goes to stdout as JSON, progress and errors to stderr."""
    if args.hosts < 1 or args.duration <= 0 or args.interval <= 0 or args.speed < 0 or args.nccl_interval < 0:
        print("simulate: --hosts >= 1, --duration > 0, --interval > 0, --speed >= 0, --nccl-interval >= 0",
              file=sys.stderr)
        return 2
    try:
        settings = load(CommonSettings)
        print(f"simulate: {args.hosts} hosts x 8 GPUs, {args.duration:g}s at speed {args.speed:g} "
              f"-> {settings.bootstrap} (prefix {settings.topic_prefix!r})", file=sys.stderr, flush=True)
        print(asyncio.run(_run(args, settings)))
    except FleetpulseError as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = configure_parser(argparse.ArgumentParser(prog="fleetpulse simulate", description=__doc__))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
