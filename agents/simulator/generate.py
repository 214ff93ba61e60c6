"""Expands a scenario's `generate` blocks into concrete faults: causes in exact proportion, seeded times and hosts."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from agents.simulator.fleet import GPUS_PER_HOST, Fleet
from agents.simulator.kinds import FAULT_ADAPTER, HOST_WIDE, NEEDS_JOB, PORT_KINDS
from agents.simulator.scenario import Generate, Scenario
from core.errors import ConfigError

STREAM = 0x6E4E  # keeps the generator's draws apart from telemetry, NCCL and XID text


def allocate(total: int, weights: list[float]) -> list[int]:
    """Largest remainder: each cause gets the floor of its exact quota, the rest go to the largest remainders.

    Exact fractions, so weights that already sum to `total` come back unchanged; ties go to the earlier cause.
    """
    w = [Fraction(x) for x in weights]
    quotas = [total * x / sum(w) for x in w]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(w)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def expand(scenario: Scenario, fleet: Fleet, seed: int) -> Scenario:
    """The scenario with each generate block's faults appended to `faults` (sorted by time) and no blocks left.

    Block b draws from its own stream of (seed, b), so adding a block leaves the others' faults as they were.
    """
    if not scenario.generate:
        return scenario
    drawn, used = [], np.zeros(fleet.n_hosts, dtype=bool)  # hosts drawn so far, by every block
    for b, block in enumerate(scenario.generate):
        drawn += _block(block, b, fleet, np.random.default_rng([seed, b, STREAM]), used)
    return scenario.model_copy(update={"faults": [*scenario.faults, *drawn], "generate": []})


def _block(block: Generate, b: int, fleet: Fleet, rng: np.random.Generator, used: np.ndarray) -> list:
    """Block b's faults; with distinct_hosts, on hosts no block drew before (while any is left)."""
    n = fleet.n_hosts
    count = block.count if block.count is not None else round(block.share_of_hosts * n)
    labels = np.repeat(np.arange(len(block.causes)), allocate(count, [c.weight for c in block.causes]))
    rng.shuffle(labels)  # hosts and times are then drawn in a random order of causes
    t0, t1 = block.between
    times = np.full(count, t0) if t0 == t1 else np.sort(rng.uniform(t0, t1, count))
    anywhere, runs_job = np.ones(n, dtype=bool), fleet.host_job >= 0
    distinct = block.distinct_hosts and count <= n
    out = []
    for c, t in zip(labels.tolist(), times.tolist()):
        cause, where = block.causes[c], f"generate.{b}.causes.{c}"
        kind = cause.fault["kind"]
        pool = runs_job if kind in NEEDS_JOB else anywhere
        if not pool.any():
            raise ConfigError(f"scenario: {where}: {kind} needs a host that runs a job; this fleet runs none")
        free = pool & ~used if distinct and (pool & ~used).any() else pool
        host = int(rng.choice(np.flatnonzero(free)))
        used[host] = True
        fault = {**cause.fault, "at": round(t, 3), "host": host, "cause": cause.cause}
        if "gpu" not in fault and kind not in HOST_WIDE:
            fault["gpu"] = int(rng.integers(GPUS_PER_HOST))
        if "port" not in fault and kind in PORT_KINDS:
            fault["port"] = int(rng.integers(GPUS_PER_HOST))  # one port per GPU
        if cause.hardware is not None:
            fault["hardware"] = cause.hardware
        out.append(FAULT_ADAPTER.validate_python(fault))  # the template was validated at load with a placement
    return out
