"""Measures the simulator: building one tick (pure, no Kafka) and the publish rate to a real broker."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from agents.simulator.simulate import FleetSimulator, simulate
from schemas.codec import encode


def bench_tick(hosts: int, ticks: int, seed: int = 0) -> dict:
    """Median wall time of step() (state + samples + NCCL records) and of encoding the samples."""
    t0 = time.perf_counter()
    sim = FleetSimulator(hosts, seed=seed, start_ts=1_700_000_000.0)
    setup = time.perf_counter() - t0
    step, samples_only, enc, size = [], [], [], 0
    for _ in range(ticks):
        t0 = time.perf_counter()
        tick = sim.step()
        step.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        blobs = [encode(s) for s in tick.samples]
        enc.append(time.perf_counter() - t0)
        size = sum(map(len, blobs))
    quiet = FleetSimulator(hosts, seed=seed, start_ts=1_700_000_000.0, nccl_interval=0)
    for _ in range(ticks):
        t0 = time.perf_counter()
        quiet.step()
        samples_only.append(time.perf_counter() - t0)
    return {
        "hosts": hosts, "gpus": hosts * 8, "ticks": ticks, "setup_s": round(setup, 3),
        "step_ms_median": round(1000 * statistics.median(step), 1),
        "step_without_nccl_ms_median": round(1000 * statistics.median(samples_only), 1),
        "encode_samples_ms_median": round(1000 * statistics.median(enc), 1),
        "nccl_records_per_tick": len(tick.nccl), "sample_bytes_mean": round(size / hosts),
    }


async def bench_publish(hosts: int, duration: float, nccl_interval: float) -> dict:
    from core.settings import CommonSettings, load

    settings = load(CommonSettings)
    report = await simulate(settings, hosts=hosts, duration=duration, speed=0, nccl_interval=nccl_interval)
    records = sum(report.sent.values())
    return {
        "hosts": hosts, "ticks": report.ticks, "wall_s": report.wall_s, "sent": report.sent,
        "records_per_s": round(records / report.wall_s),
        "samples_per_s": round(report.sent["fleet.telemetry.samples"] / report.wall_s),
        "gpu_rows_per_s": round(8 * report.sent["fleet.telemetry.samples"] / report.wall_s),
        "sim_seconds_per_wall_second": round(report.ticks * report.interval / report.wall_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/simulator.py", description=__doc__)
    p.add_argument("--tick-hosts", type=int, default=2048)
    p.add_argument("--ticks", type=int, default=10)
    p.add_argument("--publish-hosts", type=int, default=0, help="also publish to the configured broker (0 = skip)")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds to publish")
    p.add_argument("--nccl-interval", type=float, default=1.0)
    args = p.parse_args(argv)
    out = {"tick": bench_tick(args.tick_hosts, args.ticks)}
    if args.publish_hosts:
        out["publish"] = asyncio.run(bench_publish(args.publish_hosts, args.duration, args.nccl_interval))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
