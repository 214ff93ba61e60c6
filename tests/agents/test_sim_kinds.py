"""The newer fault kinds show up as real ones do (slow link, broken sensor, down host, crashed job, power surge),
and the ground truth carries cause, drain and the scenario's own expectations."""

from __future__ import annotations

import numpy as np
import pytest

from agents.simulator import FleetSimulator
from agents.simulator.gpu_state import HW_THERMAL, SW_THERMAL
from agents.simulator.xid import EXPECTED_BIN, SOFTWARE_CODES

TS0 = 1_700_000_000.0
TWO_JOBS = {"hosts": 4, "jobs": [2, 2]}  # job-0000 on hosts 0-1, job-0001 on hosts 2-3


def sim_with(faults: list[dict], seed: int = 0, fleet: dict = TWO_JOBS, **kwargs) -> FleetSimulator:
    return FleetSimulator(seed=seed, start_ts=TS0, scenario={"name": "t", "fleet": fleet, "faults": faults}, **kwargs)


def run(sim: FleetSimulator, ticks: int):
    return [sim.step() for _ in range(ticks)]


def seqs(ticks, job: str) -> list[int]:
    """Per tick: how many NCCL rank timings of `job` it carries."""
    return [sum(r["job"] == job for r in t.timings) for t in ticks]


def by_rank(ticks, job: str, field: str) -> np.ndarray:
    """Per collective (rows) and rank (columns) the field's value."""
    rows: dict[int, dict[int, float]] = {}
    for t in ticks:
        for r in t.timings:
            if r["job"] == job:
                rows.setdefault(r["seq"], {})[r["rank"]] = r[field]
    return np.array([[row[k] for k in sorted(row)] for _, row in sorted(rows.items())])


def test_congestion_slows_every_rank_of_the_job_equally_and_leaves_compute_alone():
    ticks = run(sim_with([{"kind": "congestion", "at": 30, "duration": 30, "host": 1, "factor": 3.0}], seed=2), 60)
    before, during = ticks[5:30], ticks[31:60]
    for job, grows in (("job-0000", True), ("job-0001", False)):
        c0, c1 = by_rank(before, job, "compute_us"), by_rank(during, job, "compute_us")
        w0, w1 = by_rank(before, job, "collective_us"), by_rank(during, job, "collective_us")
        assert abs(np.median(c1) / np.median(c0) - 1) < 0.02  # compute unchanged
        spread0, spread1 = np.median(c0.max(1) - c0.min(1)), np.median(c1.max(1) - c1.min(1))
        assert abs(spread1 / spread0 - 1) < 0.35  # no rank stands out
        wait_of_fastest = np.median(w1.min(1)) / np.median(w0.min(1))
        assert (2.5 < wait_of_fastest < 3.5) if grows else abs(wait_of_fastest - 1) < 0.1
    assert [g["throttle_reasons"] for g in ticks[40].samples[1]["gpus"]] == [0] * 8
    (truth,) = ticks[30].truth
    assert (truth["kind"], truth["hardware"], truth["expected"], truth["job"]) == ("congestion", False, [], "job-0000")


def test_sensor_flap_alternates_high_and_low_with_its_period_and_throttles_on_the_reading():
    flap = {"kind": "sensor_flap", "at": 10, "host": 0, "gpu": 2, "low_c": 84, "high_c": 90, "period_s": 20}
    ticks = run(sim_with([flap], interval=2), 40)
    temps = [next(g for g in t.samples[0]["gpus"] if g["index"] == 2)["gpu_temp_c"] for t in ticks]
    bits = [next(g for g in t.samples[0]["gpus"] if g["index"] == 2)["throttle_reasons"] for t in ticks]
    assert max(temps[:5]) < 80
    assert temps[5:10] == [90] * 5 and temps[10:15] == [84] * 5 and temps[15:20] == [90] * 5  # t = 10.., 20.., 30..
    assert all(b & SW_THERMAL and b & HW_THERMAL for b in bits[5:10]) and not any(b & SW_THERMAL for b in bits[10:15])
    (truth,) = ticks[5].truth
    assert truth["expected"] == ["alert:thermal"] and truth["hardware"] is True
    cool = run(sim_with([{**flap, "high_c": 86}]), 11)
    assert cool[10].truth[0]["expected"] == []


def test_host_down_silences_the_host_and_crashes_its_job_only():
    ticks = run(sim_with([{"kind": "host_down", "at": 10, "duration": 10, "host": 1}]), 30)
    hosts = [[s["host"] for s in t.samples] for t in ticks]
    assert all("gpu-node-0001" not in h and len(h) == 3 for h in hosts[10:20])
    assert all(len(h) == 4 for h in hosts[:10] + hosts[20:])
    assert seqs(ticks, "job-0000")[10:20] == [0] * 10 and all(seqs(ticks, "job-0000")[20:])
    assert all(seqs(ticks, "job-0001"))
    assert all(g["gpu_util_pct"] == 0 for g in ticks[15].samples[0]["gpus"])  # its job crashed
    (truth,) = ticks[10].truth
    # 10 s of silence clears before the silence stage calls it silence: nothing to expect (the shapes that expect
    # something: test_sim_agent_status.py)
    assert (truth["kind"], truth["hardware"], truth["expected"], truth["gpu_index"]) == ("host_down", True, [], None)


def test_job_crash_stops_nccl_records_and_nothing_else():
    quiet = run(sim_with([]), 30)
    ticks = run(sim_with([{"kind": "job_crash", "at": 10, "duration": 10, "job": "job-0001"}]), 30)
    assert seqs(ticks, "job-0001")[10:20] == [0] * 10 and all(seqs(ticks, "job-0001")[20:])
    assert seqs(ticks, "job-0000") == seqs(quiet, "job-0000")
    assert [t.samples for t in ticks] == [t.samples for t in quiet] and not any(t.xid for t in ticks)
    (truth,) = ticks[10].truth
    # 10 s without collectives is no stall yet (the silence stage waits 2 minutes): nothing to expect
    assert (truth["job"], truth["host"], truth["hardware"], truth["expected"]) == ("job-0001", "gpu-node-0002",
                                                                                   False, [])
    # the scheduler still holds the hung job's hosts: their samples name it throughout
    assert {s["job"] for t in ticks[10:20] for s in t.samples[2:]} == {"job-0001"}
    by_host = run(sim_with([{"kind": "job_crash", "at": 0, "host": 1}]), 3)
    assert seqs(by_host, "job-0000") == [0, 0, 0] and by_host[0].truth[0]["job"] == "job-0000"
    assert by_host[0].truth[0]["expected"] == ["alert:JobStalled"]  # until the run ends: a stall
    # without NCCL records nothing can see the job stop
    (quiet_truth,) = run(sim_with([{"kind": "job_crash", "at": 0, "job": 1}], nccl_interval=0), 1)[0].truth
    assert quiet_truth["expected"] == []


def test_power_surge_runs_the_gpus_flat_out_at_the_held_power():
    ticks = run(sim_with([{"kind": "power_surge", "at": 10, "duration": 10, "host": 2},
                          {"kind": "power_surge", "at": 10, "duration": 10, "host": 3, "gpu": 4, "power_w": 650}],
                         fleet={"hosts": 4, "jobs": [2]}), 30)  # hosts 2-3 idle
    surging = [g for t in ticks[11:20] for g in t.samples[2]["gpus"]]
    assert all(abs(g["power_w"] - 0.97 * 700) < 5 and g["gpu_util_pct"] == 100 for g in surging)
    one = [g for t in ticks[11:20] for g in t.samples[3]["gpus"]]
    assert all(abs(g["power_w"] - 650) < 5 for g in one if g["index"] == 4)
    assert all(g["power_w"] < 100 for g in one if g["index"] != 4)
    assert all(g["power_w"] < 100 and g["gpu_util_pct"] == 0 for g in ticks[25].samples[2]["gpus"])
    truth = ticks[10].truth
    assert [(t["hardware"], t["expected"], t["gpu_index"]) for t in truth] == [(False, [], None), (False, [], 4)]


def test_xid_crash_job_stops_the_gpus_job_for_the_faults_duration():
    ticks = run(sim_with([{"kind": "xid", "at": 10, "duration": 10, "host": 0, "gpu": 1, "code": 13,
                           "crash_job": True}]), 30)
    assert seqs(ticks, "job-0000")[10:20] == [0] * 10 and all(seqs(ticks, "job-0000")[20:])
    assert all(seqs(ticks, "job-0001"))
    assert [e["code"] for e in ticks[10].xid] == [13]
    (truth,) = ticks[10].truth
    assert truth["hardware"] is False and truth["expected"] == ["fault:xid:13", "bin:retry"]  # too short to stall


@pytest.mark.parametrize("code", sorted(EXPECTED_BIN))
def test_drain_follows_the_xid_catalog_bin(code):
    (truth,) = run(sim_with([{"kind": "xid", "at": 0, "host": 0, "gpu": 0, "code": code}]), 1)[0].truth
    drains = EXPECTED_BIN[code] in ("reset", "reboot", "inspect", "replace")
    assert ("drain" in truth["expected"]) == drains
    assert not (code in SOFTWARE_CODES and drains)  # software XIDs never drain


def test_truth_carries_cause_drain_for_node_faults_and_the_scenarios_expect():
    faults = [{"kind": "ecc_dbe", "at": 0, "host": 0, "gpu": 1, "cause": "hbm3"},
              {"kind": "row_remap_failure", "at": 0, "host": 0, "gpu": 2},
              {"kind": "gpu_lost", "at": 0, "host": 0, "gpu": 3},
              {"kind": "nvlink_crc", "at": 0, "host": 0, "gpu": 4},
              {"kind": "power_surge", "at": 0, "host": 1, "expect": ["alert:rack_power"]},
              {"kind": "slow_rank", "at": 0, "job": 0, "rank": 3, "slowdown_pct": 10, "expect": []}]
    truth = run(sim_with(faults), 1)[0].truth
    assert [t["cause"] for t in truth] == ["hbm3", "", "", "", "", ""]
    assert ["drain" in t["expected"] for t in truth] == [True, True, True, False, False, False]
    assert truth[4]["expected"] == ["alert:rack_power"] and truth[5]["expected"] == []


def test_without_nccl_records_no_straggler_is_expected():
    runaway = {"kind": "thermal_runaway", "at": 0, "host": 0, "gpu": 3}
    with_nccl = run(sim_with([runaway]), 1)[0].truth[0]["expected"]
    without = run(sim_with([runaway], nccl_interval=0), 1)[0].truth[0]["expected"]
    assert with_nccl == ["alert:thermal", "throttle:hw_thermal", "straggler"]
    assert without == ["alert:thermal", "throttle:hw_thermal"]


@pytest.mark.parametrize("fault, expected, allowed", [
    ({"kind": "host_down", "at": 5, "duration": 120, "host": 1}, [], ["fault:host_silent", "bin:reboot", "drain"]),
    ({"kind": "host_down", "at": 5, "duration": 60, "host": 1}, [], []),
    ({"kind": "host_down", "at": 5, "duration": 200, "host": 1},
     ["fault:host_silent", "bin:reboot", "drain", "alert:JobStalled"], []),
    ({"kind": "slow_rank", "at": 5, "job": 0, "rank": 3, "slowdown_pct": 4}, [], ["straggler"]),
    ({"kind": "slow_rank", "at": 5, "duration": 90, "job": 0, "rank": 3, "slowdown_pct": 20}, [], ["straggler"]),
    ({"kind": "slow_rank", "at": 5, "duration": 60, "job": 0, "rank": 3, "slowdown_pct": 20}, [], []),
    ({"kind": "slow_rank", "at": 5, "job": 0, "rank": 3, "slowdown_pct": 10}, ["straggler"], []),
    ({"kind": "power_cap", "at": 5, "duration": 100, "host": 0, "gpu": 3, "cap_w": 400},
     ["alert:GpuPowerLimitReduced", "throttle:sw_power_cap"], ["straggler"]),
])
def test_truth_allows_what_a_band_where_timing_decides_may_raise(fault, expected, allowed):
    (truth,) = [r for t in run(sim_with([fault], nccl_interval=1.0), 8) for r in t.truth]
    assert (truth["expected"], truth["allowed"]) == (expected, allowed)
