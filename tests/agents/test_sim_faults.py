"""Injected faults show up the way the real ones do: thermal, power cap, slow rank, ECC, remap, NVLink, lost GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agents.simulator import FleetSimulator
from agents.simulator.gpu_state import HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from agents.simulator.scenario import available, load_scenario

TS0 = 1_700_000_000.0
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?"
                    r"(?: GPU-I:(\d+))?\): (\d+), (.*)$")


def sim_with(faults: list[dict], hosts: int = 4, seed: int = 0, **kwargs) -> FleetSimulator:
    return FleetSimulator(hosts, seed=seed, start_ts=TS0, scenario={"name": "t", "faults": faults}, **kwargs)


def run(sim: FleetSimulator, ticks: int):
    return [sim.step() for _ in range(ticks)]


def gpu(sample: dict, index: int) -> dict | None:
    found = [g for g in sample["gpus"] if g["index"] == index]
    return found[0] if found else None


def test_thermal_runaway_crosses_slowdown_with_hw_thermal_bits_then_recovers():
    sim = FleetSimulator(4, seed=0, start_ts=TS0, scenario="thermal-runaway")  # host 0 GPU 3, 30 s + 60 s
    ticks = run(sim, 130)
    hot = [gpu(t.samples[0], 3) for t in ticks]
    temps = np.array([g["gpu_temp_c"] for g in hot])
    bits = np.array([g["throttle_reasons"] for g in hot])
    assert temps[:30].max() < 80 and not (bits[:30] & (HW_THERMAL | SW_THERMAL)).any()
    over = np.flatnonzero(temps >= 89)
    assert over.size >= 15 and 30 < over[0] < 90
    assert all(bits[i] & HW_THERMAL and bits[i] & HW_SLOWDOWN for i in over)
    assert temps.max() < 92  # toward shutdown, not past it
    assert all(hot[i]["sm_clock_mhz"] <= 0.5 * 1980 for i in over)
    assert temps[115:].max() < 80 and not (bits[100:] & (HW_THERMAL | HW_SLOWDOWN)).any()
    neighbours = [gpu(t.samples[0], 2)["gpu_temp_c"] for t in ticks]
    assert max(neighbours) < 80
    (truth,) = [r for t in ticks for r in t.truth]
    assert (truth["kind"], truth["host"], truth["gpu_index"], truth["ts"], truth["end_ts"]) == (
        "thermal_runaway", "gpu-node-0000", 3, TS0 + 30, TS0 + 90)
    # 60 s of throttling clears within the straggler dwell (8 of 10 windows of 10 s): no straggler is expected
    assert truth["job"] == "job-0000" and truth["rank"] == 3 and "straggler" not in truth["expected"]


def test_power_cap_clips_power_sets_sw_power_cap_and_lowers_clocks():
    ticks = run(sim_with([{"kind": "power_cap", "at": 5, "duration": 10, "host": 1, "gpu": 2, "cap_w": 350}]), 25)
    during = [t.samples[1] for t in ticks[6:15]]
    for s in during:
        capped, peer = gpu(s, 2), gpu(s, 3)
        assert capped["power_limit_w"] == 350 and capped["power_w"] <= 350
        assert capped["throttle_reasons"] & SW_POWER_CAP and not peer["throttle_reasons"] & SW_POWER_CAP
        assert capped["sm_clock_mhz"] < peer["sm_clock_mhz"] - 150
    after = gpu(ticks[-1].samples[1], 2)
    assert after["power_limit_w"] == 700 and not after["throttle_reasons"] & SW_POWER_CAP


def test_slow_rank_computes_slower_and_the_others_wait_longer():
    sim = sim_with([{"kind": "slow_rank", "at": 20, "job": "job-0000", "rank": 9, "slowdown_pct": 20}], seed=3)
    ticks = run(sim, 40)

    def per_rank(records, field):
        by = {}
        for r in records:
            by.setdefault(r["rank"], []).append(r[field])
        return {k: float(np.median(v)) for k, v in by.items()}

    before = [r for t in ticks[:20] for r in t.timings]
    after = [r for t in ticks[20:] for r in t.timings]
    c_before, c_after = per_rank(before, "compute_us"), per_rank(after, "compute_us")
    others = [r for r in c_after if r != 9]
    ratio = c_after[9] / np.median([c_after[r] for r in others])
    assert 1.17 < ratio < 1.23
    assert abs(c_before[9] / np.median([c_before[r] for r in others]) - 1) < 0.02
    w_before, w_after = per_rank(before, "collective_us"), per_rank(after, "collective_us")
    grown = np.median([w_after[r] - w_before[r] for r in others])
    assert grown > 0.15 * c_before[9] * 0.9  # the fast ranks now wait for rank 9
    assert w_after[9] < np.min([w_after[r] for r in others])  # the slow rank waits least
    step_ts = {r["seq"]: r["ts"] - r["compute_us"] / 1e6 for r in after}
    assert all(abs(r["ts"] - r["compute_us"] / 1e6 - step_ts[r["seq"]]) < 1e-6 for r in after)


def test_gpu_lost_removes_the_gpu_logs_xid_79_and_stops_its_job_until_it_returns():
    sim = sim_with([{"kind": "gpu_lost", "at": 10, "duration": 20, "host": 2, "gpu": 5}])
    ticks = run(sim, 40)
    present = [[g["index"] for g in t.samples[2]["gpus"]] for t in ticks]
    assert all(p == list(range(8)) for p in present[:10] + present[30:])
    assert all(p == [0, 1, 2, 3, 4, 6, 7] for p in present[10:30])
    assert all(len(t.samples) == 4 for t in ticks)
    events = [e for t in ticks for e in t.xid]
    assert [e["code"] for e in events] == [79, 154]
    lost = events[0]
    assert lost["raw_line"].endswith("kernel: NVRM: Xid (PCI:0000:ab:00): 79, GPU has fallen off the bus.")
    assert lost["raw_line"].startswith("Nov 14 22:13:30 gpu-node-0002 ")
    assert (lost["host"], lost["gpu_index"], lost["ts"], lost["pid"]) == ("gpu-node-0002", 5, TS0 + 10, None)
    assert "to 0x2 (Node Reboot Required)" in events[1]["message"]
    assert all(t.nccl == [] for t in ticks[10:30]) and all(t.nccl for t in ticks[30:])
    assert all(g["gpu_util_pct"] == 0 for g in ticks[15].samples[0]["gpus"])  # its job crashed
    back = gpu(ticks[35].samples[2], 5)
    assert back["recovery_action"] == 0 and back["last_xid"] is None


def test_ecc_dbe_counts_logs_xid_48_and_marks_a_pending_remap():
    ticks = run(sim_with([{"kind": "ecc_dbe", "at": 3, "duration": 10, "host": 0, "gpu": 1}]), 20)
    g = [gpu(t.samples[0], 1) for t in ticks]
    assert [x["ecc_dbe_volatile"] for x in g[:3]] == [0, 0, 0] and g[3]["ecc_dbe_volatile"] == 1
    assert g[3]["ecc_dbe_aggregate"] == 1 and g[19]["ecc_dbe_aggregate"] == 1
    assert g[3]["row_remap_pending"] and g[3]["remapped_rows_uncorrectable"] == 1
    assert g[3]["recovery_action"] == 1 and g[3]["last_xid"] == 48
    assert not g[13]["row_remap_pending"] and g[13]["recovery_action"] == 0  # the GPU reset activated the remap
    assert [e["code"] for e in ticks[3].xid] == [48, 63, 154]
    assert "uncorrectable double bit error (DBE)" in ticks[3].xid[0]["raw_line"]


def test_row_remap_failure_and_nvlink_crc_growth():
    sim = sim_with([{"kind": "row_remap_failure", "at": 2, "host": 3, "gpu": 0},
                    {"kind": "nvlink_crc", "at": 5, "duration": 20, "host": 1, "gpu": 7, "rate_per_s": 100}])
    ticks = run(sim, 30)
    assert gpu(ticks[2].samples[3], 0)["row_remap_failure"] and not gpu(ticks[1].samples[3], 0)["row_remap_failure"]
    assert [e["code"] for e in ticks[2].xid] == [64, 154]
    crc = [gpu(t.samples[1], 7)["nvlink_crc_errors"] for t in ticks]
    peer = [gpu(t.samples[1], 6)["nvlink_crc_errors"] for t in ticks]
    assert 1500 < crc[24] - crc[4] < 2500
    assert crc[29] - crc[25] <= 2 and peer[29] - peer[0] <= 2


def test_xid_storm_repeats_and_every_line_parses_like_the_kernel_log():
    codes = [13, 31, 43, 45, 48, 62, 63, 74, 79, 94, 95, 109, 119, 999]
    faults = [{"kind": "xid", "at": 1 + i, "host": i % 4, "gpu": i % 8, "code": c} for i, c in enumerate(codes)]
    faults.append({"kind": "xid", "at": 20, "host": 0, "gpu": 0, "code": 45, "count": 5, "every": 2.0,
                   "caused_by": 79})
    ticks = run(sim_with(faults), 35)
    events = [e for t in ticks for e in t.xid]
    for e in events:
        m = XID_RE.search(e["raw_line"])
        assert m, e["raw_line"]
        assert (m.group(1) + ".0", int(m.group(3)), m.group(4)) == (e["pci_bus_id"], e["code"], e["message"])
    storm = [e for e in events if e["code"] == 45 and e["caused_by"] == 79]
    assert [e["ts"] - TS0 for e in storm] == [20, 22, 24, 26, 28]
    assert all(e["raw_line"].endswith("caused by previous Xid 79") for e in storm)
    thirteen = next(e for e in events if e["code"] == 13)
    assert "pid='<unknown>', name=<unknown>, Graphics SM Warp Exception" in thirteen["raw_line"]
    truth = {r["kind"]: r for t in ticks for r in t.truth}
    assert truth["xid13"]["hardware"] is False and truth["xid79"]["hardware"] is True
    assert "bin:reboot" in truth["xid79"]["expected"]


def test_host_level_target_hits_all_gpus_and_truth_has_no_gpu_index():
    ticks = run(sim_with([{"kind": "power_cap", "at": 0, "host": "gpu-node-0001", "cap_w": 300}]), 3)
    assert all(g["power_limit_w"] == 300 for g in ticks[2].samples[1]["gpus"])
    (truth,) = ticks[0].truth
    assert truth["gpu_index"] is None and truth["rank"] is None and truth["job"] == "job-0000"


def test_every_shipped_scenario_runs_alone_from_its_own_fleet_and_run_blocks():
    for name in available():
        scenario = load_scenario(name)
        plan = scenario.plan()
        sim = FleetSimulator(seed=plan.seed, start_ts=TS0, scenario=scenario, interval=plan.interval_s,
                             nccl_interval=plan.nccl_interval_s)
        assert sim.scenario.name == name and sim.fleet.n_hosts == plan.hosts
        ticks = run(sim, 3)
        assert len(ticks[0].samples) == plan.hosts, name
        assert not sim.scenario.generate  # drawn into faults
    assert load_scenario("baseline").faults == []


def test_a_completed_repair_clears_what_a_reset_clears_and_a_replacement_the_rest():
    """The evaluation's bot tells the simulator a repair is done: the next samples show the GPU recovered, as after a
    real reset, so a health gate that stays after a repair means the repair did not work."""
    sim = FleetSimulator(2, seed=1, start_ts=1_700_000_000.0, nccl_interval=0)
    s = sim.state
    s.recovery_action[9], s.row_remap_pending[9], s.row_remap_failure[9], s.ecc_dbe_volatile[9] = 2, True, True, 3
    s.ecc_dbe_aggregate[9], s.recovery_action[1] = 5, 1
    sim.repaired(sim.fleet.hosts[1], "repair")
    gpu = sim.step().samples[1]["gpus"][1]
    assert (gpu["recovery_action"], gpu["row_remap_pending"], gpu["ecc_dbe_volatile"]) == (0, False, 0)
    assert (gpu["row_remap_failure"], gpu["ecc_dbe_aggregate"]) == (True, 5)  # the same card: its history stays
    assert sim.state.recovery_action[1] == 1  # another host's GPU: untouched
    sim.repaired(sim.fleet.hosts[1], "replace")
    gpu = sim.step().samples[1]["gpus"][1]
    assert (gpu["row_remap_failure"], gpu["ecc_dbe_aggregate"]) == (False, 0)


def port_of(tick, host: int, port: int) -> dict:
    [sample] = [n for n in tick.net if n["host"] == f"gpu-node-{host:04d}"]
    return sample["ports"][port]


def test_every_host_reports_its_eight_ib_ports_every_30_s_and_they_pass_the_topic_check():
    from schemas.topics import NET
    ticks = run(sim_with([], hosts=3, interval=10.0), 7)
    assert [len(t.net) for t in ticks] == [3, 0, 0, 3, 0, 0, 3]
    for n in ticks[3].net:
        NET.check(n)
        assert [(p["device"], p["state"], p["rate_gbps"], p["link_downed"]) for p in n["ports"]] == [
            (f"mlx5_{i}", "ACTIVE", 400.0, 0) for i in range(8)]
    assert port_of(ticks[6], 0, 0)["port_xmit_data"] > port_of(ticks[3], 0, 0)["port_xmit_data"] > 0


def test_port_faults_show_in_state_rate_and_counters_and_a_repair_ends_them():
    faults = [{"kind": "link_flap", "at": 20, "host": 0, "port": 1, "flaps": 3, "every": 60},
              {"kind": "link_down", "at": 20, "host": 1, "port": 2},
              {"kind": "link_degraded", "at": 20, "host": 2, "port": 3, "rate_gbps": 200}]
    sim = sim_with(faults, hosts=3, interval=10.0)
    ticks = run(sim, 25)
    flap = [port_of(t, 0, 1)["link_downed"] for t in ticks if t.net]
    assert flap == [0, 1, 1, 2, 2, 3, 3, 3, 3][:len(flap)]  # drops at 20, 80, 140 s; samples every 30 s and port_of(ticks[-1], 0, 1)["symbol_error"] > 0
    assert port_of(ticks[3], 1, 2)["state"] == "DOWN" and port_of(ticks[3], 1, 2)["link_downed"] == 1
    assert port_of(ticks[3], 2, 3)["rate_gbps"] == 200.0 and port_of(ticks[3], 2, 3)["rate"] == "200 Gb/sec (2X NDR)"
    assert port_of(ticks[3], 0, 0)["state"] == "ACTIVE" and port_of(ticks[3], 1, 3)["state"] == "ACTIVE"
    sim.repaired("gpu-node-0001", "repair")
    after = [sim.step() for _ in range(3)][-1]
    assert port_of(after, 1, 2)["state"] == "ACTIVE" and port_of(after, 1, 2)["link_downed"] == 0  # counters reset
    truth = {r["kind"]: r["expected"] for t in ticks for r in t.truth}
    assert truth == {"link_flap": ["fault:ib_link_flap", "fault:ib_phy_errors", "bin:inspect", "drain"],
                     "link_down": ["fault:ib_link_flap", "fault:ib_link_down", "bin:inspect", "drain"],
                     "link_degraded": ["fault:ib_rate_degraded", "bin:inspect", "drain"]}


PORT_GRID = [
    {"kind": "link_degraded", "at": 0}, {"kind": "link_degraded", "at": 40}, {"kind": "link_degraded", "at": 40,
                                                                               "duration": 50},
    {"kind": "link_down", "at": 0}, {"kind": "link_down", "at": 25}, {"kind": "link_down", "at": 25, "duration": 50},
    {"kind": "link_down", "at": 30, "duration": 61}, {"kind": "nic_down", "at": 0}, {"kind": "nic_down", "at": 45},
    {"kind": "nic_down", "at": 45, "duration": 40},
    {"kind": "link_flap", "at": 0, "flaps": 3, "every": 200, "errors_per_s": 0},
    {"kind": "link_flap", "at": 20, "flaps": 1}, {"kind": "link_flap", "at": 20, "flaps": 3, "every": 600,
                                                  "errors_per_s": 0},
    {"kind": "link_flap", "at": 20, "flaps": 2, "every": 120, "errors_per_s": 0.4},  # 48 errors + 2 drops: 50
    {"kind": "link_flap", "at": 20, "flaps": 4, "every": 40, "errors_per_s": 0.4},  # 48 errors + 3 drops: 51
    {"kind": "link_flap", "at": 250, "flaps": 2, "every": 100, "errors_per_s": 0.6},
]


@pytest.mark.parametrize("fault", PORT_GRID, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_port_fault_truth_is_what_the_fault_bin_rules_find_in_the_simulated_samples(fault):
    """The simulator's truth and the real rules (streams/fault_bins) agree on every port fault of the grid: the
    codes found on the host are the truth's fault tokens, and a drain bin is found exactly when it expects a drain."""
    from streams.fault_bins.rules import DEFAULTS, check_record, evaluate
    sim = sim_with([{"host": 0, "port": 2, **fault}], hosts=1, interval=10.0)
    records, truth, state, found = [], [], {}, []
    for tick in run(sim, 200):
        truth += tick.truth
        records = [check_record(e, "host_event") for e in tick.host_events] + [check_record(n, "net") for n in
                                                                                tick.net]
        result = evaluate(records, state, DEFAULTS)
        state.update(result.state)
        found += result.faults
    [t] = truth
    assert {f"fault:{f.code}" for f in found} == {tok for tok in t["expected"] if tok.startswith("fault:")}, found
    assert any(f.bin in ("reset", "reboot", "inspect", "replace") for f in found) == ("drain" in t["expected"])


def test_a_failed_nic_and_a_failed_disk_log_lines_the_agents_parser_reads_at_their_own_time():
    from schemas.topics import HOST_EVENTS
    ticks = run(sim_with([{"kind": "nic_down", "at": 15, "host": 1, "port": 4},
                          {"kind": "ssd_error", "at": 15, "host": 2, "device": "nvme1"}], hosts=3, interval=10.0), 10)
    events = [(t.index, e) for t in ticks for e in t.host_events]
    for k, e in events:
        HOST_EVENTS.check(e)
        assert e["ts"] <= TS0 + 10 * k  # never ahead of the tick that publishes it
    nic = [(e["code"], e["device"]) for _, e in events if e["host"] == "gpu-node-0001"]
    assert nic == [("mlx5_cmd_timeout", "0000:9c:00.0"), ("mlx5_health_compromised", "0000:9c:00.0")]
    disk = [e["code"] for _, e in events if e["host"] == "gpu-node-0002"]
    assert disk == ["nvme_timeout", "nvme_timeout", "nvme_controller_down", "nvme_controller_down", "block_io_error",
                    "fs_error", "fs_readonly"]
    assert port_of(ticks[3], 1, 4)["state"] == "DOWN"
