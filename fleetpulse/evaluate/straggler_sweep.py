"""The stragglers sweep: one slow rank per cell, over slowdowns, job sizes, rank positions and episode lengths.

    python -m fleetpulse.evaluate.sweep stragglers [--pcts 5,7,10,15,30] [--ranks 16,128,512,2048]
        [--durations 30,60,90,120,300,600] [--seeds 1]

Each cell simulates one synchronous job (the simulator's NCCL model: 1.5 % compute noise per collective, a small
persistent offset per rank, a collective every 2 s) with one rank slowed from 120 s on, and feeds its timings tick
by tick through `streams.stragglers.scoring.advance`, the function the stragglers stage's score step calls (its
other step only adds the GPU's throttle reasons to each score). A cell passes when what was flagged is what the
simulator's truth says a slow rank of that size and length must raise (agents/simulator/truth.py
straggler_outcome, of its slowdown against the job's median rank: `vs_peers`): a straggler within `within_s` of
onset and no other rank, or nothing at all; in the bands where the window grid's phase or a window's scatter decides
("either"), only no other rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.simulator.kinds import SlowRank
from agents.simulator.simulate import FleetSimulator
from agents.simulator.truth import straggler_outcome
from streams.stragglers.scoring import ScoringConfig, advance
from streams.stragglers.windows import Batch

T0 = 1_800_000_000.0
ONSET_S = 120.0
PCTS = (5.0, 7.0, 10.0, 15.0, 30.0)
RANKS = (16, 128, 512, 2048)
DURATIONS = (30.0, 60.0, 90.0, 120.0, 300.0, 600.0)
PHASES = (0.0, 2.5, 5.0, 7.5)  # seconds after a window boundary


@dataclass(frozen=True)
class Cell:
    """One cell: the slow rank's parameters, when it was first flagged and when that flag cleared (s after onset and
    after the slowness ended), and how many other ranks were flagged."""

    pct: float
    vs_peers: float  # the slowdown against the job's median rank (the simulator's per-rank offsets included)
    world: int
    rank: int
    duration: float | None
    phase: float  # onset this many seconds after a window boundary
    seed: int
    first_flag_s: float | None
    cleared_s: float | None  # the slow rank's first clear after the end of its slowness (persistent: after onset)
    others: int
    truth: str
    within_s: float
    clear_within_s: float = 120.0  # clear_after x window_s (60 s) past the last slow window, with room to spare

    def ok(self) -> bool:
        if self.others or (self.first_flag_s is not None and self.first_flag_s < 0):
            return False  # another rank, or this one before it slowed
        if self.first_flag_s is not None:  # a flag holds while the rank is slow and clears soon after
            if self.duration is None and self.cleared_s is not None:
                return False
            if self.duration is not None and not (self.cleared_s is not None and
                                                  0 <= self.cleared_s <= self.clear_within_s):
                return False
        if self.truth == "straggler":
            return self.first_flag_s is not None and self.first_flag_s <= self.within_s
        return self.truth == "either" or self.first_flag_s is None


def positions(world: int) -> tuple[int, ...]:
    """First, middle and last rank: the first and last hosts of the job, and one inside it."""
    return tuple(sorted({0, world // 2 + 3, world - 1}))


def run_cell(pct: float, world: int, rank: int, duration: float | None = None, *, phase: float = 0.0,
             seed: int = 0, within_s: float = 180.0, cfg: ScoringConfig = ScoringConfig(), nccl_interval_s: float = 2.0) -> Cell:
    """The run starts `phase` s after a window boundary, so the slowness (from ONSET_S, a simulator tick, on) does."""
    hosts = max(1, world // 8)
    fault = {"kind": "slow_rank", "at": ONSET_S, "job": "job-0000", "rank": rank, "slowdown_pct": pct}
    if duration is not None:
        fault["duration"] = duration
    run_s = ONSET_S + (duration or 0.0) + within_s + 30.0
    scenario = {"name": "stragglers-sweep", "fleet": {"hosts": hosts, "jobs": [hosts]}, "faults": [fault]}
    sim = FleetSimulator(scenario=scenario, seed=seed, start_ts=T0 + phase, interval=5.0,
                         nccl_interval=nccl_interval_s)
    onset = sim.start_ts + ONSET_S
    end = onset + (duration if duration is not None else 0.0)
    state, first, cleared, others = None, None, None, set()
    for _ in range(round(run_s / sim.interval)):
        records = sim.step().nccl
        if not records:
            continue
        state, scores, _ = advance(state, "job-0000", Batch.of(records), cfg)
        for s in scores:
            if s.rank != rank:
                others.update([s.rank] if s.flagged else [])
            elif s.flagged:
                first = s.ts - onset if first is None else first
            elif cleared is None:
                cleared = s.ts - end
    truth = straggler_outcome(SlowRank.model_validate({**fault, "slowdown_pct": max(vs_peers(sim, rank, pct), 0.1)}))
    return Cell(pct, round(vs_peers(sim, rank, pct), 2), world, rank, duration, phase, seed, first, cleared,
                len(others), truth, within_s)


def vs_peers(sim: FleetSimulator, rank: int, pct: float) -> float:
    """How much slower than the job's median rank a rank `pct` slower than itself computes: each rank of the
    simulator keeps a small offset of its own (0.3 % sd), and the rule compares ranks with each other, not with
    their past (a rank 1 % faster than its peers that slows by 5 % is 3.9 % slower than they are)."""
    bias = sim.nccl.rank_bias[0]
    return 100.0 * ((1 + pct / 100) * (1 + bias[rank]) / (1 + float(np.median(bias))) - 1)


def persistent(pcts=PCTS, ranks=RANKS, seeds: int = 1) -> list[Cell]:
    """Every slowdown x job size x rank position, slow until the run ends."""
    return [run_cell(p, w, r, seed=s) for p in pcts for w in ranks for r in positions(w) for s in range(seeds)]


def episodes(durations=DURATIONS, pcts=(10.0, 50.0), world: int = 128, phases=PHASES) -> list[Cell]:
    """Slowness of each length and strength on one rank, starting at several phases of the 10 s window grid."""
    return [run_cell(p, world, world // 2 + 3, d, phase=ph) for d in durations for p in pcts for ph in phases]


def table(cells: list[Cell]) -> str:
    lines = ["| slowdown % | vs peers % | ranks | rank | lasts s | onset phase s | seed | truth | "
             "flagged s after onset | cleared s after end | other ranks | ok |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for c in cells:
        lasts = "-" if c.duration is None else f"{c.duration:g}"
        first = "-" if c.first_flag_s is None else f"{c.first_flag_s:.0f}"
        cleared = "-" if c.cleared_s is None else f"{c.cleared_s:.0f}"
        lines.append(f"| {c.pct:g} | {c.vs_peers:.1f} | {c.world} | {c.rank} | {lasts} | {c.phase:g} | {c.seed} | "
                     f"{c.truth} | {first} | {cleared} | {c.others} | {'yes' if c.ok() else 'NO'} |")
    return "\n".join(lines)
