"""Cost of the straggler scoring core at 1,024 ranks: one window's timings (NcclStep records, 8 ranks each) decoded,
checked and folded, and one window closed (robust z, K-of-N persistence), as medians over --repeat runs (JSON out).

    python bench/straggler_windows.py [--repeat 5] [--out bench/results/straggler_windows.json]

The timings are the simulator's own NCCL model (one collective per second per rank, one job over 128 hosts).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import orjson

from agents.simulator.fleet import Job, build_fleet
from agents.simulator.nccl import NcclModel
from schemas.topics import NCCL
from streams.stragglers.windows import Batch, JobState, Window
from streams.stragglers.scoring import ScoringConfig, advance, persist, score

from report import save  # bench/report.py, beside this script

T0 = 1_700_000_000.0


def window_of_timings(window_s: float, hosts: int = 128, seed: int = 10) -> list[bytes]:
    """One window's collectives (one a second) as the agents publish them; a few seconds more are simulated."""
    seconds = int(window_s)
    fleet = build_fleet(hosts, seed=seed)
    fleet.jobs = [Job(0, "job-0000", tuple(range(hosts)))]
    fleet.host_job[:] = 0
    model, job, slow = NcclModel(fleet, np.random.default_rng(seed)), fleet.jobs[0], np.ones(fleet.n_gpus)
    steps = [r for k in range(seconds + 5) for r in model.job_records(job, T0 + k, slow)]  # one per host and second
    return [orjson.dumps(r) for r in steps[:seconds * hosts]]


def fold(raw: list[bytes], cfg: ScoringConfig) -> float:
    started = time.perf_counter()
    decoded = [NCCL.decode(x) for x in raw]
    state = None
    for i in range(0, len(decoded), 500):  # the worker's batch: 500 records (NcclSteps of 8 ranks)
        state, _, _ = advance(state, "job-0000", Batch.of(decoded[i:i + 500]), cfg)
    return time.perf_counter() - started


def close(cfg: ScoringConfig, reps: int = 200) -> float:
    acc = Window.empty(1024)
    per_rank = int(cfg.window_s)  # one timing a second
    acc.n_c[:], acc.n_w[:], acc.records, acc.with_compute = per_rank, per_rank, 1024 * per_rank, 1024 * per_rank
    acc.sum_c[:], acc.sum_w[:] = np.random.default_rng(0).normal(7.5e5, 3e3, 1024) * per_rank, 1e5 * per_rank
    started = time.perf_counter()
    for _ in range(reps):
        persist(JobState("j", 1024, cfg.window_s), score(acc, cfg), T0, T0 + cfg.window_s, cfg)
    return (time.perf_counter() - started) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench/results/straggler_windows.json"))
    args = p.parse_args()
    cfg = ScoringConfig()
    raw = window_of_timings(cfg.window_s)
    folds = [fold(raw, cfg) for _ in range(args.repeat)]
    closes = [close(cfg) for _ in range(args.repeat)]
    timings = sum(len(orjson.loads(r)["ranks"]) for r in raw)
    out = {"ranks": 1024, "window_s": cfg.window_s, "records": len(raw), "timings": timings, "repeat": args.repeat,
           "fold_window_ms_median": round(statistics.median(folds) * 1e3, 1),
           "fold_us_per_timing_median": round(statistics.median(folds) / timings * 1e6, 2),
           "close_window_ms_median": round(statistics.median(closes) * 1e3, 3)}
    save(out, args.out)


if __name__ == "__main__":
    main()
