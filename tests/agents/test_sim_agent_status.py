"""Each simulated host agent's status on fleet.telemetry.agent: one at start and every 60 s, a goodbye before a
planned stop, silence when a host or a whole rack dies, the failing collector while a monitor is broken; and the
ground truth a silence detector is scored against."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from agents.simulator import FleetSimulator
from agents.simulator.generate import expand
from agents.simulator.fleet import build_fleet
from agents.simulator.scenario import SCENARIO_DIR, load_scenario, parse_scenario
from agents.simulator.status import COLLECTORS
from core.errors import ConfigError
from schemas.events import AgentStatus
from schemas.topics import AGENT

TS0 = 1_700_000_000.0
FLEET = {"hosts": 8, "jobs": [2, 2, 2], "hosts_per_rack": 4}  # job-0000 hosts 0-1, job-0001 2-3, job-0002 4-5
NVML_ERROR = "NVMLError_Unknown: Unknown Error"


def sim_with(faults: list[dict], fleet: dict = FLEET, interval: float = 10.0, **kwargs) -> FleetSimulator:
    return FleetSimulator(seed=0, start_ts=TS0, interval=interval,
                          scenario={"name": "t", "fleet": fleet, "faults": faults}, **kwargs)


def run(sim: FleetSimulator, ticks: int):
    return [sim.step() for _ in range(ticks)]


def statuses(ticks, host: str) -> list[tuple[float, str, dict]]:
    """(seconds after the start, state, failing) of every status `host` published."""
    return [(a["ts"] - TS0, a["state"], a["failing"]) for t in ticks for a in t.agent if a["host"] == host]


def sampled(ticks, host: str) -> list[float]:
    return [t.ts - TS0 for t in ticks for s in t.samples if s["host"] == host]


def nccl_of(ticks, job: str) -> list[int]:
    return [sum(r["job"] == job for r in t.nccl) for t in ticks]


def test_every_host_publishes_a_valid_status_at_start_and_every_60_s_keyed_by_host():
    ticks = run(sim_with([]), 60)  # 600 s at 10 s
    by_host = defaultdict(list)
    for t in ticks:
        for a in t.agent:
            AgentStatus.model_validate(a, strict=True)
            assert AGENT.check(a) == a and AGENT.key_of(a) == a["host"].encode()
            assert a["ts"] == t.ts
            by_host[a["host"]].append(a)
    assert sorted(by_host) == [f"gpu-node-{h:04d}" for h in range(8)]
    for host, records in by_host.items():
        assert [r["ts"] - TS0 for r in records] == [60.0 * k for k in range(10)], host
        assert [r["seq"] for r in records] == list(range(10))
        assert {(r["state"], r["source"], str(r["failing"]), tuple(r["collectors"])) for r in records} == {
            ("running", "simulator", "{}", COLLECTORS)}
    first = by_host["gpu-node-0005"][0]
    assert (first["rack"], first["cluster"], first["job"]) == ("rack-001", "sim", "job-0002")
    assert by_host["gpu-node-0007"][0]["job"] is None  # an idle host


def test_the_periodic_status_keeps_its_60_s_phase_at_any_tick_interval():
    ticks = run(sim_with([], interval=7.0), 86)  # 0 .. 595 s
    times = [s[0] for s in statuses(ticks, "gpu-node-0000")]
    assert len(times) == 10 and times[0] == 0.0
    assert all(53 <= b - a <= 67 for a, b in zip(times, times[1:])), times  # due every 60 s, sent at the next tick
    assert not any(t.agent for t in run(sim_with([], status_interval=0), 20))  # status records off


def test_a_crashed_host_goes_silent_with_no_goodbye_and_returns_with_a_running_status():
    faults = [{"kind": "host_down", "at": 100, "duration": 100, "host": 1},
              {"kind": "xid", "at": 150, "host": 1, "gpu": 0, "code": 79},  # logged while down: nobody reads it
              {"kind": "xid", "at": 250, "host": 1, "gpu": 0, "code": 13}]
    ticks = run(sim_with(faults), 40)
    assert statuses(ticks, "gpu-node-0001") == [(0.0, "running", {}), (60.0, "running", {}),
                                                (200.0, "running", {}), (260.0, "running", {}),
                                                (320.0, "running", {}), (380.0, "running", {})]
    assert [s[0] for s in statuses(ticks, "gpu-node-0000")] == [0.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0]
    assert not {100.0 + 10 * k for k in range(10)} & set(sampled(ticks, "gpu-node-0001"))
    assert 200.0 in sampled(ticks, "gpu-node-0001")
    assert [(e["ts"] - TS0, e["code"]) for t in ticks for e in t.xid] == [(250.0, 13)]
    assert nccl_of(ticks, "job-0000")[10:20] == [0] * 10 and all(nccl_of(ticks, "job-0001"))


def test_a_repair_brings_a_host_that_died_for_good_back_and_one_down_for_a_while_stays_down():
    sim = sim_with([{"kind": "host_down", "at": 10, "host": 1},
                    {"kind": "host_down", "at": 10, "duration": 100, "host": 2},
                    {"kind": "host_down", "at": 10, "host": 4, "whole_rack": True}])
    run(sim, 5)
    for host in ("gpu-node-0001", "gpu-node-0002", "gpu-node-0004"):
        sim.repaired(host, "repair")
    tick = sim.step()
    assert [s["host"] for s in tick.samples] == ["gpu-node-0000", "gpu-node-0001", "gpu-node-0003"]
    assert [(a["host"], a["state"]) for a in tick.agent] == [("gpu-node-0001", "running")]


def test_an_announced_host_down_says_goodbye_then_nothing_until_it_is_back():
    ticks = run(sim_with([{"kind": "host_down", "at": 100, "duration": 100, "host": 2, "announced": True,
                           "cause": "host_maintenance"}]), 30)
    assert statuses(ticks, "gpu-node-0002") == [(0.0, "running", {}), (60.0, "running", {}),
                                                (100.0, "stopping", {}), (200.0, "running", {}),
                                                (260.0, "running", {})]
    samples = sampled(ticks, "gpu-node-0002")
    assert 90.0 in samples and 200.0 in samples and not [t for t in samples if 100 <= t < 200]
    assert nccl_of(ticks, "job-0001")[10:20] == [0] * 10 and all(nccl_of(ticks, "job-0001")[20:])
    (truth,) = ticks[10].truth
    assert (truth["kind"], truth["hardware"], truth["cause"]) == ("host_down", False, "host_maintenance")
    # the run's last status of the host, had it ended during the maintenance, is its goodbye
    assert [a["state"] for t in ticks[:15] for a in t.agent if a["host"] == "gpu-node-0002"][-1] == "stopping"


def test_a_whole_rack_goes_silent_at_once_with_one_truth_per_host_and_no_drain_expected():
    ticks = run(sim_with([{"kind": "host_down", "at": 100, "duration": 210, "host": 5, "whole_rack": True,
                           "cause": "rack_switch"}]), 40)
    rack1 = [f"gpu-node-{h:04d}" for h in (4, 5, 6, 7)]
    for k in range(10, 31):
        assert [s["host"] for s in ticks[k].samples] == [f"gpu-node-{h:04d}" for h in range(4)]
        assert not {a["host"] for a in ticks[k].agent} & set(rack1)
    assert {a["host"] for a in ticks[31].agent} == set(rack1)  # back at once (310 s), each with a running status
    assert all(a["state"] == "running" for t in ticks for a in t.agent)  # no goodbye
    assert nccl_of(ticks, "job-0002")[10:31] == [0] * 21 and all(nccl_of(ticks, "job-0000"))
    truth = ticks[10].truth
    assert [t["host"] for t in truth] == ["gpu-node-0005", "gpu-node-0004", "gpu-node-0006", "gpu-node-0007"]
    assert [t["fault_id"].rsplit("-", 1)[1] for t in truth] == ["000.000", "000.001", "000.002", "000.003"]
    assert {(t["kind"], t["rack"], tuple(t["expected"]), t["hardware"], t["end_ts"]) for t in truth} == {
        ("rack_down", "rack-001", ("alert:RackSilent",), True, TS0 + 310)}
    assert [t["job"] for t in truth] == ["job-0002", "job-0002", None, None]  # job-0002 is all in the rack
    by_rank = run(sim_with([{"kind": "host_down", "at": 0, "job": "job-0002", "rank": 9, "whole_rack": True}]), 1)
    assert [t["host"] for t in by_rank[0].truth] == ["gpu-node-0005", "gpu-node-0004", "gpu-node-0006",
                                                     "gpu-node-0007"]
    assert by_rank[0].samples[-1]["host"] == "gpu-node-0003" and all(t["rank"] is None for t in by_rank[0].truth)
    planned = run(sim_with([{"kind": "host_down", "at": 100, "duration": 200, "host": 0, "whole_rack": True,
                             "announced": True}]), 11)
    assert {(a["host"], a["state"]) for a in planned[10].agent} == {
        (f"gpu-node-{h:04d}", "stopping") for h in range(4)}
    assert {(t["kind"], tuple(t["expected"]), t["hardware"]) for t in planned[10].truth} == {
        ("rack_down", (), False)}


def test_a_broken_monitor_sends_statuses_naming_the_failing_collector_and_no_samples():
    quiet = run(sim_with([]), 50)
    ticks = run(sim_with([{"kind": "monitor_broken", "at": 100, "duration": 200, "host": 3}]), 50)
    assert statuses(ticks, "gpu-node-0003") == (
        [(0.0, "running", {}), (60.0, "running", {})]
        + [(100.0 + 10 * k, "running", {"nvml": NVML_ERROR}) for k in range(20)]  # every tick while it fails
        + [(300.0, "running", {}), (360.0, "running", {}), (420.0, "running", {}), (480.0, "running", {})])
    samples = sampled(ticks, "gpu-node-0003")
    assert 90.0 in samples and 300.0 in samples and not [t for t in samples if 100 <= t < 300]
    assert [t.nccl for t in ticks] == [t.nccl for t in quiet]  # the GPUs and their job run on
    assert [t.samples for t in ticks[:10]] == [t.samples for t in quiet[:10]]
    (truth,) = ticks[10].truth
    assert (truth["kind"], truth["expected"], truth["hardware"], truth["gpu_index"], truth["job"]) == (
        "monitor_broken", ["alert:MonitorBroken"], False, None, "job-0001")  # its job runs on: no stall
    custom = run(sim_with([{"kind": "monitor_broken", "at": 0, "host": 0, "error": "NVMLError_GpuIsLost"}]), 1)
    assert custom[0].agent[0]["failing"] == {"nvml": "NVMLError_GpuIsLost"}


def test_monitor_broken_and_host_down_take_no_gpu_and_generated_ones_get_none():
    for kind in ("monitor_broken", "host_down"):
        with pytest.raises(ConfigError, match="leave gpu out"):
            load_scenario({"name": "t", "faults": [{"kind": kind, "at": 0, "host": 0, "gpu": 1}]})
    doc = {"name": "g", "generate": [{"count": 4, "between": [10, 20], "causes": [
        {"cause": "nvml", "weight": 1, "fault": {"kind": "monitor_broken", "duration": 60}},
        {"cause": "switch", "weight": 1, "fault": {"kind": "host_down", "whole_rack": True, "duration": 60}}]}]}
    faults = expand(parse_scenario(doc), build_fleet(8, seed=0), seed=1).faults
    assert sorted(f.kind for f in faults) == ["host_down", "host_down", "monitor_broken", "monitor_broken"]
    assert all(f.gpu is None for f in faults) and all(f.whole_rack for f in faults if f.kind == "host_down")


@pytest.mark.parametrize("nccl, duration, expected", [
    (1.0, 150, ["alert:JobStalled"]), (1.0, None, ["alert:JobStalled"]), (1.0, 140, []), (0.0, 600, [])])
def test_a_hung_job_is_a_job_stall_when_nccl_records_show_it_long_enough(nccl, duration, expected):
    ticks = run(sim_with([{"kind": "job_crash", "at": 20, "duration": duration, "job": "job-0001"}],
                         nccl_interval=nccl), 8)
    (truth,) = ticks[2].truth
    assert truth["expected"] == expected and truth["hardware"] is False and truth["job"] == "job-0001"
    # its hosts still report samples naming the job (the scheduler holds the allocation), and their agents too
    assert {(s["host"], s["job"]) for t in ticks[2:] for s in t.samples if s["host"] in ("gpu-node-0002",
                                                                                        "gpu-node-0003")} == {
        ("gpu-node-0002", "job-0001"), ("gpu-node-0003", "job-0001")}
    assert {a["job"] for t in ticks for a in t.agent if a["host"] == "gpu-node-0002"} == {"job-0001"}


SILENT = ("fault:host_silent", "bin:reboot", "drain")
RACK = ("alert:RackSilent",)
STALL = ("alert:JobStalled",)
SPANNING = {"hosts": 8, "jobs": [3, 3], "hosts_per_rack": 4}  # job-0000 hosts 0-2, job-0001 3-5 (both racks), 6-7 idle


@pytest.mark.parametrize("fault, nccl, want", [
    ({"host": 6}, 1.0, [("gpu-node-0006", SILENT, True)]),  # an idle host dies
    ({"host": 0}, 1.0, [("gpu-node-0000", SILENT + STALL, True)]),  # its job's other hosts report on
    ({"host": 0}, 0.0, [("gpu-node-0000", SILENT, True)]),
    ({"host": 0, "duration": 149}, 1.0, [("gpu-node-0000", (), True)]),  # back before it is silence
    ({"host": 0, "duration": 150}, 1.0, [("gpu-node-0000", SILENT + STALL, True)]),
    ({"host": 6, "announced": True, "duration": 600}, 1.0, [("gpu-node-0006", (), False)]),
    ({"host": 0, "announced": True, "duration": 600}, 1.0, [("gpu-node-0000", STALL, False)]),
    ({"host": 6, "whole_rack": True}, 1.0, [("gpu-node-0006", RACK, True), ("gpu-node-0004", RACK + STALL, True),
                                            ("gpu-node-0005", RACK + STALL, True), ("gpu-node-0007", RACK, True)]),
    ({"host": 0, "whole_rack": True}, 1.0, [(f"gpu-node-{h:04d}", RACK, True) for h in range(3)]
     + [("gpu-node-0003", RACK + STALL, True)]),  # job-0000 is all in the rack; job-0001 has hosts 4-5 outside
    ({"host": 6, "whole_rack": True, "duration": 100}, 1.0, [(f"gpu-node-{h:04d}", (), True) for h in (6, 4, 5, 7)]),
    ({"host": 6, "whole_rack": True, "announced": True}, 0.0, [(f"gpu-node-{h:04d}", (), False)
                                                               for h in (6, 4, 5, 7)]),
])
def test_what_a_host_down_expects_by_shape_length_and_job(fault, nccl, want):
    ticks = run(sim_with([{"kind": "host_down", "at": 0, **fault}], fleet=SPANNING, nccl_interval=nccl), 1)
    assert [(t["host"], tuple(t["expected"]), t["hardware"]) for t in ticks[0].truth] == want


def test_faults_that_stop_a_job_while_its_hosts_report_expect_a_job_stall_only_with_nccl():
    faults = [{"kind": "gpu_lost", "at": 0, "host": 0, "gpu": 1},
              {"kind": "xid", "at": 0, "host": 2, "gpu": 0, "code": 13, "crash_job": True, "duration": 600},
              {"kind": "xid", "at": 0, "host": 4, "gpu": 0, "code": 13},
              {"kind": "monitor_broken", "at": 0, "host": 5},
              {"kind": "gpu_lost", "at": 0, "host": 1, "gpu": 1, "duration": 60}]  # back before it is a stall
    with_nccl = [t["expected"] for t in run(sim_with(faults), 1)[0].truth]
    assert [("alert:JobStalled" in e) for e in with_nccl] == [True, True, False, False, False]
    without = [t["expected"] for t in run(sim_with(faults, nccl_interval=0), 1)[0].truth]
    assert not any("alert:JobStalled" in e for e in without)


def test_llama3_mix_maintenance_says_goodbye_and_hardware_host_faults_go_silent():
    doc = json.loads((SCENARIO_DIR / "llama3-mix.json").read_text())
    by_cause = defaultdict(list)
    for c in doc["generate"][0]["causes"]:
        by_cause[c["cause"]].append(c["fault"])
    assert [f["announced"] for f in by_cause["host_maintenance"]] == [True]
    silent = ("power_supply", "server_chassis", "io_expansion_board", "cpu", "system_memory")
    assert all(by_cause[c] == [{"kind": "host_down"}] for c in silent)
    assert [f["kind"] for f in by_cause["network_switch_cable"]] == ["link_flap", "link_down"]
    assert [f["kind"] for f in by_cause["nic"] + by_cause["ssd"]] == ["nic_down", "ssd_error"]
    assert doc["run"]["nccl_interval_s"] == 0
    # the evaluation test's smaller mix (256 hosts, 120 faults by 800 s): every kind of host fault is in it
    doc["fleet"]["hosts"], doc["generate"][0]["count"], doc["generate"][0]["between"] = 256, 120, [30, 800]
    sim = FleetSimulator(seed=0, start_ts=TS0, scenario=parse_scenario(doc), interval=30, nccl_interval=0)
    maintenance = {f.host for f in sim.scenario.faults if f.cause == "host_maintenance"}
    truth = defaultdict(list)
    for t in run(sim, 28):
        for r in t.truth:
            truth[r["cause"]].append(r)
        goodbyes = {sim.fleet.hosts.index(a["host"]) for a in t.agent if a["state"] == "stopping"}
        assert goodbyes <= maintenance
    assert len(truth["host_maintenance"]) == 10
    assert {(tuple(r["expected"]), r["hardware"]) for r in truth["host_maintenance"]} == {((), False)}
    down = [r for c in silent for r in truth[c]]
    assert len(down) == 4 and {(tuple(r["expected"]), r["hardware"], r["end_ts"]) for r in down} == {
        (("fault:host_silent", "bin:reboot", "drain"), True, None)}
    # switch/cable, NIC and SSD faults now show on the host's ports and in its kernel log: each drains
    seen = [r for c in ("network_switch_cable", "nic", "ssd") for r in truth[c]]
    assert len(seen) == 13 and all(r["hardware"] and "drain" in r["expected"] for r in seen)
    crashed = [r for c in ("silent_data_corruption", "nccl_watchdog_timeout") for r in truth[c]]
    assert len(crashed) == 4 and all(r["expected"] == [] for r in crashed)  # no NCCL records at this size


def test_status_records_cost_a_record_per_speaking_host_not_per_host():
    sim = FleetSimulator(2048, seed=0, start_ts=TS0, interval=30, nccl_interval=0)
    counts = [len(sim.step().agent) for _ in range(6)]
    assert counts == [2048, 0, 2048, 0, 2048, 0]
    assert np.all(sim.statuses.seq == 3)


def shipped(name: str):
    scenario = load_scenario(name)
    plan = scenario.plan()
    sim = FleetSimulator(seed=plan.seed, start_ts=TS0, scenario=scenario, interval=plan.interval_s,
                         nccl_interval=plan.nccl_interval_s)
    return sim, run(sim, round(plan.duration_s / plan.interval_s))


def test_host_silence_scenario_a_dead_host_a_maintained_one_and_a_dead_rack():
    sim, ticks = shipped("host-silence")
    truth = [(r["kind"], r["host"], r["rack"], tuple(r["expected"]), r["hardware"], r["ts"] - TS0,
              r["end_ts"] and r["end_ts"] - TS0) for t in ticks for r in t.truth]
    assert truth[:2] == [
        ("host_down", "gpu-node-0003", "rack-000", ("fault:host_silent", "bin:reboot", "drain"), True, 120, None),
        ("host_down", "gpu-node-0012", "rack-001", (), False, 180, 480)]
    assert sorted(truth[2:]) == [("rack_down", f"gpu-node-{h:04d}", "rack-003", ("alert:RackSilent",), True, 400, 700)
                                 for h in range(24, 32)]
    assert statuses(ticks, "gpu-node-0003") == [(0.0, "running", {}), (60.0, "running", {})]
    assert [s[1] for s in statuses(ticks, "gpu-node-0012")][2:5] == ["running", "stopping", "running"]
    # 390 s: the dead host and the one in maintenance; 490 s and 690 s: the dead host and rack-003; 700 s: rack back
    assert [len(ticks[k].samples) for k in (11, 39, 49, 69, 70)] == [32, 30, 23, 23, 31]
    assert not any(t.nccl for t in ticks) and sim.fleet.racks.count("rack-003") == 8


def test_job_stall_and_broken_monitor_scenarios():
    _, ticks = shipped("job-stall")
    ((truth,),) = [t.truth for t in ticks if t.truth]
    assert (truth["kind"], truth["job"], truth["expected"], truth["ts"] - TS0, truth["end_ts"] - TS0) == (
        "job_crash", "job-0001", ["alert:JobStalled"], 120, 420)
    assert all(nccl_of(ticks, "job-0000")) and nccl_of(ticks, "job-0001")[24:84] == [0] * 60
    assert all(nccl_of(ticks, "job-0001")[:24]) and all(nccl_of(ticks, "job-0001")[84:])
    assert all(len(t.samples) == 16 for t in ticks)  # every host reports throughout
    _, ticks = shipped("broken-monitor")
    ((truth,),) = [t.truth for t in ticks if t.truth]
    assert (truth["kind"], truth["host"], truth["expected"], truth["hardware"]) == (
        "monitor_broken", "gpu-node-0002", ["alert:MonitorBroken"], False)
    failing = [s[0] for s in statuses(ticks, "gpu-node-0002") if s[2]]
    assert failing == [120.0 + 10 * k for k in range(30)]
    assert not [t for t in sampled(ticks, "gpu-node-0002") if 120 <= t < 420]
