"""Straggler detection over many seeds: the `straggler` scenario's NCCL timings through the scoring core alone.

    python bench/straggler_recall.py [--seeds 100] [--pct 5 10 20] [--out bench/results/straggler_recall.json]

`fleetpulse evaluate --scenario straggler` runs the whole pipeline and costs about a minute a seed; this feeds the
same simulated timings (one 1,024-rank job, rank 517 slowed from 120 s) tick by tick through `streams.stragglers.scoring
.advance`, the function the stragglers stage calls, so recall and false flags can be counted over a hundred seeds.
Per slowdown: the share of seeds whose slow rank is flagged within --within seconds of onset, the delay quantiles,
and how many other ranks were flagged in all (the pipeline adds transport, not decisions).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from agents.simulator.simulate import FleetSimulator
from fleetpulse.evaluate.plan import apply_override, load_document
from agents.simulator.scenario import parse_scenario
from streams.stragglers.windows import Batch
from streams.stragglers.scoring import advance

from report import save  # bench/report.py, beside this script


def one_seed(pct: float, seed: int, duration_s: float) -> tuple[float | None, int]:
    """(seconds from onset to the slow rank's first flag or None, other ranks flagged) for one seed."""
    doc = load_document("straggler")
    apply_override(doc, f"faults.0.slowdown_pct={pct}")
    scenario = parse_scenario(doc, "straggler")
    fault = scenario.faults[0]
    sim = FleetSimulator(scenario=scenario, seed=seed, start_ts=1_800_000_000.0)
    onset = sim.start_ts + fault.at
    state, first, others = None, None, set()
    for _ in range(round(duration_s / sim.interval)):
        records = sim.step().nccl
        if not records:
            continue
        state, scores, _ = advance(state, "job-0000", Batch.of(records))
        for s in scores:
            if not s.flagged:
                continue
            if s.rank == fault.rank:
                first = s.ts - onset if first is None else first
            else:
                others.add(s.rank)
    return first, len(others)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--pct", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    ap.add_argument("--duration", type=float, default=300.0, help="simulated seconds per seed (onset at 120 s)")
    ap.add_argument("--within", type=float, default=120.0, help="a flag later than this after onset is a miss")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    for pct in args.pct:
        began = time.monotonic()
        delays, others = [], 0
        for seed in range(args.seeds):
            first, other = one_seed(pct, seed, args.duration)
            delays.append(np.inf if first is None else first)
            others += other
        d = np.array(delays)
        found = d[np.isfinite(d)]
        results[f"{pct:g}%"] = {
            "seeds": args.seeds, "recall_within": round(float((d <= args.within).mean()), 4),
            "flagged_at_all": round(float(np.isfinite(d).mean()), 4),
            "delay_s_p50": float(np.percentile(found, 50)) if found.size else None,
            "delay_s_p95": float(np.percentile(found, 95)) if found.size else None,
            "delay_s_max": float(found.max()) if found.size else None,
            "other_ranks_flagged": others, "wall_s": round(time.monotonic() - began, 1)}
        print(json.dumps({f"{pct:g}%": results[f"{pct:g}%"]}), flush=True)
    out = {"within_s": args.within, "duration_s": args.duration, "results": results}
    save(out, args.out)


if __name__ == "__main__":
    main()
