"""Gray memory failures over many seeds: how long before a GPU fails hard is it suspect, and how often is a healthy
GPU called suspect.

    python bench/gray_recall.py [--seeds 100] [--hosts 8] [--ramps 4] [--healthy-days 8] [--out FILE]

Each seed simulates `--hosts` hosts (8 GPUs each, samples every `--interval` s) in which `--ramps` GPUs degrade: their
corrected ECC errors climb exponentially (agents/simulator/kinds.py `ecc_ramp`) from 1-12 an hour to 300-20,000 an
hour over a lead of 1 to 12 hours (log-uniform), then they fail hard (an uncorrectable error or a row that cannot be
remapped). The samples and Xid lines go tick by tick through `streams.fault_bins.rules.evaluate`, the function the
fault-bin stage calls. Per ramp: the lead (failure time minus the first `ecc_trend` fault), or a miss. Then healthy
fleets (no fault, but the simulator's background errors and its 2 % of GPUs with a steady trickle of 1-30 corrected
errors an hour) run `--healthy-days` days each, and every `ecc_trend` there is a false suspect. The pipeline adds
transport, not decisions: `fleetpulse evaluate --scenario gpu-gray` runs a ramp through all of it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from agents.simulator.simulate import FleetSimulator
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import HostState
from streams.fault_bins.rules import check_record, evaluate

from report import save  # bench/report.py, beside this script

T0 = 1_760_000_000.0  # in the past: the validators refuse samples from the future
HARD = {"ecc_dbe", "row_remap_failure", "xid:48", "xid:64"}


def ramps(seed: int, hosts: int, count: int) -> list[dict]:
    """The seed's ramps: distinct GPUs, each starting 1-2 h in (the rule has its hour of history by then)."""
    rng = np.random.default_rng(10_000 + seed)
    gpus = rng.choice(hosts * 8, size=count, replace=False)
    return [{"kind": "ecc_ramp", "host": int(g // 8), "gpu": int(g % 8), "at": float(rng.uniform(3600, 7200)),
             "lead_s": float(math.exp(rng.uniform(math.log(3600), math.log(43_200)))),
             "start_per_h": float(rng.uniform(1, 12)),
             "end_per_h": float(math.exp(rng.uniform(math.log(300), math.log(20_000)))),
             "fails_with": str(rng.choice(["dbe", "row_remap_failure"]))} for g in gpus]


def run(scenario: dict, seed: int, hosts: int, interval: float, duration_s: float, config: FaultBinConfig) -> list:
    """Every fault event of the run, through the fault-bin rules as the stage applies them."""
    sim = FleetSimulator(hosts, seed=seed, start_ts=T0, scenario=scenario, interval=interval, nccl_interval=0,
                         net_interval=0, status_interval=0)
    states: dict[str, HostState] = {}
    faults = []
    for _ in range(round(duration_s / interval)):
        tick = sim.step()
        records = [check_record(x, "xid") for x in tick.xid] + [check_record(s, "sample") for s in tick.samples]
        for _, v in records:
            states.setdefault(v["host"], HostState())
        result = evaluate(records, states, config, owned=True)
        faults += result.faults
    return faults


def one_seed(seed: int, hosts: int, count: int, interval: float, config: FaultBinConfig) -> list[dict]:
    """Per ramp: its lead (s), when it failed and when it was first suspect."""
    faults_in = ramps(seed, hosts, count)
    duration = max(f["at"] + f["lead_s"] for f in faults_in) + 600.0
    faults = run({"name": "gray", "faults": faults_in}, seed, hosts, interval, duration, config)
    out = []
    for f in faults_in:
        host, gpu = f"gpu-node-{f['host']:04d}", f["gpu"]
        mine = [e for e in faults if e.host == host and e.gpu_index == gpu]
        suspect = min((e.first_ts for e in mine if e.code == "ecc_trend"), default=None)
        failed = T0 + f["at"] + f["lead_s"]
        out.append({"lead_planned_s": round(f["lead_s"]), "suspect_before_s": None if suspect is None
                    else round(failed - suspect), "hard_seen": any(e.code in HARD for e in mine),
                    "modes": sorted({e.evidence.get("mode", "immediate") for e in mine if e.code == "ecc_trend"})})
    return out


def healthy(seed: int, hosts: int, interval: float, days: float, config: FaultBinConfig) -> dict:
    """False suspects on a fleet with no fault at all over `days`."""
    faults = run({"name": "healthy", "faults": []}, 50_000 + seed, hosts, interval, days * 86_400, config)
    suspects = [e for e in faults if e.code == "ecc_trend"]
    return {"gpu_days": hosts * 8 * days, "false_suspects": len(suspects),
            "where": sorted({f"{e.host}/{e.gpu_index}" for e in suspects})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--ramps", type=int, default=4, help="degrading GPUs per seed")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--healthy-fleets", type=int, default=4)
    ap.add_argument("--healthy-hosts", type=int, default=16)
    ap.add_argument("--healthy-days", type=float, default=8.0)
    ap.add_argument("--lead", type=float, default=1800.0, help="suspect at least this long before the failure")
    ap.add_argument("--config", type=json.loads, default={}, help="fault-bin parameters to try, as JSON "
                    "(FLEETPULSE_FAULT_BINS's form), e.g. '{\"trend_sigma\": 3}'")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    config, began = FaultBinConfig(**args.config), time.monotonic()
    rows = [r for seed in range(args.seeds) for r in one_seed(seed, args.hosts, args.ramps, args.interval, config)]
    before = np.array([np.nan if r["suspect_before_s"] is None else r["suspect_before_s"] for r in rows])
    planned = np.array([r["lead_planned_s"] for r in rows])
    buckets = {}
    for name, lo, hi in (("lead 1-2 h", 3600, 7200), ("lead 2-6 h", 7200, 21_600), ("lead 6-12 h", 21_600, 43_201)):
        sel = (planned >= lo) & (planned < hi)
        b = before[sel]
        buckets[name] = {"ramps": int(sel.sum()), "suspect_30min_before": round(float(np.mean(b >= args.lead)), 4),
                         "suspect_at_all": round(float(np.mean(np.isfinite(b) & (b > 0))), 4),
                         "before_min_p50": round(float(np.nanpercentile(b, 50)) / 60, 1) if np.isfinite(b).any()
                         else None}
    fleets = [healthy(k, args.healthy_hosts, args.interval, args.healthy_days, config)
              for k in range(args.healthy_fleets)]
    gpu_days = sum(f["gpu_days"] for f in fleets)
    false = sum(f["false_suspects"] for f in fleets)
    out = {
        "seeds": args.seeds, "ramps": len(rows), "interval_s": args.interval, "config": args.config,
        "suspect_30min_before": round(float(np.mean(before >= args.lead)), 4),
        "suspect_before_failure": round(float(np.mean(before > 0)), 4),
        "before_min_p05_p50": [round(float(np.nanpercentile(before, q)) / 60, 1) for q in (5, 50)],
        "by_lead": buckets,
        "hard_failures_seen": sum(r["hard_seen"] for r in rows),
        "suspect_modes": sorted({m for r in rows for m in r["modes"]}),
        "healthy": {"gpu_days": gpu_days, "false_suspects": false,
                    "per_1000_gpu_days": round(1000 * false / gpu_days, 3), "fleets": fleets},
        "wall_s": round(time.monotonic() - began, 1),
    }
    save(out, args.out)


if __name__ == "__main__":
    main()
