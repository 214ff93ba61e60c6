"""Scenario blocks: fleet layouts, run defaults, and generate blocks drawn in exact proportion from the seed."""

from __future__ import annotations

from collections import Counter

import pytest

from agents.simulator import FleetSimulator
from agents.simulator.fleet import build_fleet
from agents.simulator.generate import allocate, expand
from agents.simulator.scenario import load_scenario
from core.errors import ConfigError

TS0 = 1_700_000_000.0
MIX = [("faulty_gpu", 148, {"kind": "gpu_lost", "duration": 900}), ("hbm3", 72, {"kind": "ecc_dbe"}),
       ("software_bug", 54, {"kind": "xid", "code": 13, "crash_job": True}),
       ("switch", 35, {"kind": "job_crash"}), ("maintenance", 32, {"kind": "host_down"}),
       ("cpu", 2, {"kind": "host_down"})]


def generated(count: int, hosts: int = 400, seed: int = 0, **block) -> list:
    causes = [{"cause": c, "weight": w, "fault": f} for c, w, f in MIX]
    scenario = load_scenario({"name": "g", "generate": [{"count": count, "between": [60, 1500], "causes": causes,
                                                          **block}]})
    return expand(scenario, build_fleet(hosts, seed=seed), seed).faults


@pytest.mark.parametrize("total, weights, want", [
    (419, [148, 72, 54, 35, 32, 19, 17, 7, 7, 6, 6, 3, 3, 2, 2, 2, 2, 2],
     [148, 72, 54, 35, 32, 19, 17, 7, 7, 6, 6, 3, 3, 2, 2, 2, 2, 2]),
    (10, [1, 1, 1], [4, 3, 3]),  # a tie goes to the earlier cause
    (7, [0.5, 0.25, 0.25], [3, 2, 2]),  # quotas 3.5, 1.75, 1.75: the larger remainders win
    (0, [3, 1], [0, 0]),
])
def test_largest_remainder_keeps_proportions_as_exactly_as_integers_allow(total, weights, want):
    got = allocate(total, weights)
    assert got == want and sum(got) == total
    quotas = [total * w / sum(weights) for w in weights]
    assert all(abs(g - q) < 1 for g, q in zip(got, quotas))


def test_generated_faults_keep_the_mix_and_are_deterministic_per_seed():
    faults = generated(343)
    assert Counter(f.cause for f in faults) == {c: w for c, w, _ in MIX}
    assert [f.model_dump() for f in faults] == [f.model_dump() for f in generated(343)]
    assert [f.host for f in faults] != [f.host for f in generated(343, seed=1)]
    assert len({f.host for f in faults}) == 343  # distinct hosts while there are enough
    assert all(60 <= f.at <= 1500 for f in faults) and [f.at for f in faults] == sorted(f.at for f in faults)
    fleet = build_fleet(400)
    assert all(fleet.host_job[f.host] >= 0 for f in faults if f.kind == "job_crash")
    assert all(f.gpu is None for f in faults if f.kind in ("job_crash", "host_down"))
    assert {f.gpu for f in faults if f.kind == "gpu_lost"} <= set(range(8))
    assert {f.duration for f in faults if f.kind == "gpu_lost"} == {900}


def test_hosts_repeat_only_when_asked_or_when_there_are_more_faults_than_hosts():
    assert len({f.host for f in generated(50, hosts=50)}) == 50
    assert len({f.host for f in generated(60, hosts=50)}) < 50  # more faults than hosts: independent draws
    assert len({f.host for f in generated(40, hosts=50, distinct_hosts=False)}) < 40


def test_share_of_hosts_storm_hits_distinct_hosts_at_one_time():
    sim = FleetSimulator(seed=0, start_ts=TS0, scenario="drain-storm", interval=10, nccl_interval=0)
    faults = sim.scenario.faults
    assert len(faults) == 20 and len({f.host for f in faults}) == 20
    assert {(f.kind, f.code, f.at, f.cause, f.hardware) for f in faults} == {("xid", 119, 120, "bad_signal", False)}
    ticks = [sim.step() for _ in range(13)]
    assert [len(t.truth) for t in ticks] == [0] * 12 + [20]
    assert all("drain" in t["expected"] and t["cause"] == "bad_signal" for t in ticks[12].truth)


def test_llama3_mix_expands_to_its_419_interruptions_and_steps():
    sim = FleetSimulator(seed=0, start_ts=TS0, scenario="llama3-mix", interval=30, nccl_interval=0)
    causes = Counter(f.cause for f in sim.scenario.faults)
    assert sum(causes.values()) == 419 and causes["faulty_gpu"] == 148 and causes["software_bug"] == 54
    assert len(sim.scenario.faults) == len({f.host for f in sim.scenario.faults})
    tick = sim.step()
    assert len(tick.samples) == 2048


def test_explicit_job_layout_gives_one_1024_rank_job():
    sim = FleetSimulator(seed=0, start_ts=TS0, scenario="straggler", interval=5, nccl_interval=0)
    (job,) = sim.fleet.jobs
    assert job.world_size == 1024 and sim.fleet.hosts[job.hosts[-1]] == "gpu-node-0127"
    truth = [r for t in [sim.step() for _ in range(25)] for r in t.truth]
    assert [(r["job"], r["rank"], r["host"], r["gpu_index"]) for r in truth] == [
        ("job-0000", 517, "gpu-node-0064", 5)]
    fleet = build_fleet(10, jobs=[4, 3], hosts_per_rack=4)
    assert [j.hosts for j in fleet.jobs] == [(0, 1, 2, 3), (4, 5, 6)] and list(fleet.host_job[7:]) == [-1] * 3
    assert fleet.racks[4] == "rack-001"


@pytest.mark.parametrize("doc, field", [
    ({"fleet": {"hosts": 4, "jobs": [4, 1]}}, "fleet.jobs:"),
    ({"fleet": {"jobs": [0]}}, "fleet.jobs.0:"),
    ({"fleet": {"rack_budgets_w": {"rack-000": -5}}}, "fleet.rack_budgets_w.rack-000:"),
    ({"fleet": {"racks": 2}}, "fleet.racks:"),
    ({"run": {"interval_s": 0}}, "run.interval_s:"),
    ({"run": {"seed": -1}}, "run.seed:"),
    ({"generate": [{"between": [0, 1], "causes": [{"cause": "x", "weight": 1, "fault": {"kind": "gpu_lost"}}]}]},
     "generate.0: Value error, give exactly one of count and share_of_hosts"),
    ({"generate": [{"count": 1, "between": [5, 1], "causes": [{"cause": "x", "weight": 1,
                                                               "fault": {"kind": "gpu_lost"}}]}]}, "generate.0:"),
    ({"generate": [{"count": 1, "between": [0, 1], "causes": []}]}, "generate.0.causes:"),
    ({"generate": [{"count": 1, "between": [0, 1], "causes": [{"cause": "x", "weight": 0,
                                                               "fault": {"kind": "gpu_lost"}}]}]},
     "generate.0.causes.0.weight:"),
    ({"generate": [{"count": 1, "between": [0, 1], "causes": [{"cause": "x", "weight": 1,
                                                               "fault": {"kind": "xid"}}]}]},
     "generate.0.causes.0.fault: Value error, xid.code: Field required"),
    ({"generate": [{"count": 1, "between": [0, 1], "causes": [{"cause": "x", "weight": 1,
                                                               "fault": {"kind": "gpu_lost", "host": 3}}]}]},
     "generate.0.causes.0.fault: Value error, host: placed by the generator"),
    ({"faults": [{"kind": "sensor_flap", "at": 0, "host": 0, "low_c": 90, "high_c": 84}]}, "faults.0.sensor_flap:"),
    ({"faults": [{"kind": "host_down", "at": 0, "host": 0, "gpu": 1}]}, "faults.0.host_down:"),
    ({"faults": [{"kind": "congestion", "at": 0, "host": 0, "factor": 0.5}]}, "faults.0.congestion.factor:"),
    ({"faults": [{"kind": "power_surge", "at": 0, "host": 0, "power_w": 900}]}, "faults.0.power_surge.power_w:"),
    ({"faults": [{"kind": "gpu_lost", "at": 0, "host": 0, "expect": "drain"}]}, "faults.0.gpu_lost.expect:"),
])
def test_config_errors_name_the_field(doc, field):
    with pytest.raises(ConfigError) as err:
        load_scenario({"name": "t", **doc})
    assert field in str(err.value)


def test_placement_errors_name_the_field():
    with pytest.raises(ConfigError, match="faults.0.host: gpu-node-0003 runs no job"):
        FleetSimulator(4, scenario={"name": "t", "fleet": {"jobs": [2]},
                                    "faults": [{"kind": "job_crash", "at": 0, "host": 3}]})
    with pytest.raises(ConfigError, match="generate.0.causes.0: job_crash needs a host that runs a job"):
        FleetSimulator(4, scenario={"name": "t", "fleet": {"jobs": []}, "generate": [
            {"count": 1, "between": [0, 0], "causes": [{"cause": "x", "weight": 1, "fault": {"kind": "job_crash"}}]}]})
