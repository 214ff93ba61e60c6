"""Corrected errors that climb make a GPU suspect long before it fails; a steady trickle never does; a suspect asks
for a drain after its job, never at once."""

from __future__ import annotations

import numpy as np

from agents.simulator import FleetSimulator
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import GpuMemo, HostState
from streams.fault_bins.rules import check_record
from streams.fault_bins.trends import trend_findings
from streams.lifecycle.rules import LifecycleConfig, Node, on_fault
from tests.streams.test_fault_bins import Table

CFG = FaultBinConfig()
T0 = 1_760_000_000.0


def reading(count: int, index: int = 3) -> dict:
    return {"index": index, "uuid": "GPU-x", "pci_bus_id": "0000:18:00.0", "ecc_sbe_aggregate": count,
            "remapped_rows_correctable": 0, "remap_banks_low": 0, "remap_banks_none": 0}


def feed(memo: GpuMemo, rates_per_h: list[float], step_s: float = 60.0, seed: int = 0) -> list[tuple[float, list]]:
    """Poisson counts at each rate for one step each; (ts, findings) whenever the count moved."""
    rng, count, ts, out = np.random.default_rng(seed), 0, T0, []
    trend_findings("3", reading(count), memo, ts, "h1", CFG)
    for rate in rates_per_h:
        ts += step_s
        new = int(rng.poisson(rate * step_s / 3600))
        if new:
            count += new
            out.append((ts, trend_findings("3", reading(count), memo, ts, "h1", CFG)))
    return out


def test_a_steady_trickle_is_never_suspect_however_long_it_runs():
    for rate in (2.0, 30.0, 300.0, 3000.0):  # up to nearly one a second, for 3 days
        memo = GpuMemo()
        assert [f for _, found in feed(memo, [rate] * (3 * 1440), seed=int(rate)) for f in found] == []


def test_a_climb_is_suspect_once_with_the_numbers_that_made_it_and_asks_for_a_drain_after_the_job():
    memo = GpuMemo()
    climb = [6.0 * (2000 / 6) ** (k / 90) for k in range(90)]  # 6 -> 2,000 an hour over 90 min
    told = [(ts, f) for ts, found in feed(memo, [4.0] * 600 + climb, seed=7) for f in found]
    [(ts, f)] = told
    assert (f.code, f.bin, f.rule, f.action) == ("ecc_trend", "inspect", "trend_ecc", "DRAIN_WHEN_IDLE")
    assert f.evidence["mode"] == "after_jobs" and float(f.evidence["per_h_fast"]) >= 30
    assert float(f.evidence["per_h_fast"]) >= 2 * float(f.evidence["per_h_slow"]) and float(f.evidence["sigma"]) >= 4
    assert "corrected ECC errors climbing" in f.reasons[0] and "never at once" in f.reasons[0]
    failure = T0 + (600 + 90) * 60.0
    assert failure - ts >= 30 * 60  # suspect half an hour or more before the failure it heads for


def test_a_reset_forgets_the_suspect_so_a_climb_that_goes_on_is_told_again():
    memo = GpuMemo()
    climb = [6.0 * 300 ** (k / 60) for k in range(60)]
    assert len([f for _, found in feed(memo, [4.0] * 300 + climb, seed=2) for f in found]) == 1
    memo.rebooted(T0 + 99_999, "driver version changed", CFG)
    rng_count = memo.tr[1] + 500
    assert [f.code for f in trend_findings("3", reading(rng_count), memo, memo.tr[0] + 60, "h1", CFG)] == ["ecc_trend"]


def test_the_trend_memory_survives_the_state_round_trip():
    st = HostState()
    memo = st.memo("3")
    feed(memo, [4.0] * 200 + [400.0] * 30, seed=3)
    assert HostState.from_json(st.to_json()).gpus["3"].tr == memo.tr and memo.tr[2] is not None


def test_a_suspect_s_fault_becomes_a_drain_proposal_after_the_job_and_a_hard_fault_then_makes_it_now():
    cfg, n = LifecycleConfig(), Node()
    suspect = {"fault_id": "s1", "ts": T0, "host": "h1", "gpu_index": 3, "code": "ecc_trend", "bin": "inspect",
               "rule": "trend_ecc", "count": 1, "first_ts": T0, "last_ts": T0, "evidence": {"mode": "after_jobs"}}
    out = on_fault(n, "h1", suspect, cfg)
    [proposal] = out.proposals
    assert (proposal["repair"], proposal["mode"]) == ("inspect", "after_jobs")
    hard = {**suspect, "fault_id": "d1", "code": "ecc_dbe", "bin": "reset", "rule": "counter_dbe", "evidence": {},
            "ts": T0 + 60, "first_ts": T0 + 60, "last_ts": T0 + 60}
    on_fault(n, "h1", hard, cfg)  # before the breaker answered: one proposal, now urgent
    assert (n.proposal["cause"]["repair"], n.proposal["cause"]["mode"]) == ("inspect", "immediate")
    assert n.proposal["cause"]["reason"].startswith("fault ecc_dbe -> reset")


def test_ramps_in_the_simulator_are_suspect_before_they_fail_and_the_trickling_gpus_never():
    scenario = {"name": "gray", "faults": [
        {"kind": "ecc_ramp", "at": 1800, "host": 0, "gpu": 1, "lead_s": 5400},
        {"kind": "ecc_ramp", "at": 600, "host": 3, "gpu": 6, "lead_s": 7200, "start_per_h": 2, "end_per_h": 900,
         "fails_with": "row_remap_failure"}]}
    sim = FleetSimulator(24, seed=11, start_ts=T0, scenario=scenario, interval=60.0, nccl_interval=0,
                         net_interval=0, status_interval=0)
    assert (sim.state.sbe_trickle > 0).sum() >= 2  # the fleet has GPUs with a steady trickle
    table, truth = Table(), []
    for _ in range(int(9000 / 60)):
        tick = sim.step()
        truth += tick.truth
        table.feed([check_record(x, "xid") for x in tick.xid] + [check_record(s, "sample") for s in tick.samples])
    suspects = {(f.host, f.gpu_index): f.first_ts for f in table.faults if f.code == "ecc_trend"}
    assert set(suspects) == {("gpu-node-0000", 1), ("gpu-node-0003", 6)}
    assert T0 + 1800 + 5400 - suspects[("gpu-node-0000", 1)] >= 1800
    assert T0 + 600 + 7200 - suspects[("gpu-node-0003", 6)] >= 1800
    assert all(t["expected"] == ["fault:ecc_trend", "bin:inspect", "drain"] for t in truth)
