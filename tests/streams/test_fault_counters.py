"""Counter faults and simulator scenarios: each injection's faults match the simulator's truth tokens and bins."""

from __future__ import annotations

import pytest

from agents.simulator import FleetSimulator
from agents.simulator.xid import EXPECTED_BIN
from schemas.analytics import FaultBin
from streams.fault_bins.rules import DEFAULTS, check_record
from streams.fault_bins.config import FaultBinConfig, rule_table
from tests.streams.test_fault_bins import TS0, Table, host_sample

SEVERITY = {b.value: i for i, b in enumerate(FaultBin)}  # mildest first
XID_CODES = (13, 43, 48, 64, 79, 95, 109, 119)
SCENARIO = {"name": "fault-bins", "faults": [
    {"kind": "ecc_dbe", "at": 5, "duration": 40, "host": 0, "gpu": 1},
    {"kind": "row_remap_failure", "at": 6, "host": 0, "gpu": 2},
    {"kind": "nvlink_crc", "at": 7, "duration": 30, "host": 1, "gpu": 3},
    {"kind": "gpu_lost", "at": 8, "duration": 20, "host": 1, "gpu": 5},
    {"kind": "pcie_replay", "at": 9, "duration": 30, "host": 2, "gpu": 0},
    {"kind": "thermal_runaway", "at": 10, "duration": 30, "host": 2, "gpu": 6},  # no fault bin: an alert's job
    *({"kind": "xid", "at": 4 + i, "host": 3 + i // 8, "gpu": i % 8, "code": code}
      for i, code in enumerate(XID_CODES)),
]}


def simulate(ticks: int = 70, config: FaultBinConfig = DEFAULTS):
    sim = FleetSimulator(5, seed=3, start_ts=TS0, scenario=SCENARIO, nccl_interval=0)
    table, truth = Table(config), []
    for _ in range(ticks):
        tick = sim.step()
        truth += tick.truth
        table.feed([check_record(x, "xid") for x in tick.xid] + [check_record(s, "sample") for s in tick.samples])
    return table, truth


@pytest.fixture(scope="module")
def run():
    return simulate()


def test_every_injection_raises_the_faults_and_bin_its_truth_expects(run):
    table, truth = run
    by_gpu: dict[tuple, list] = {}
    for f in table.faults:
        by_gpu.setdefault((f.host, f.gpu_index), []).append(f)
    checked = 0
    for t in truth:
        faults = by_gpu.get((t["host"], t["gpu_index"]), [])
        codes, bins = {f.code for f in faults}, {f.bin for f in faults}
        wanted = [tok.split(":", 1)[1] for tok in t["expected"] if tok.startswith("fault:")]
        assert set(wanted) <= codes, (t["kind"], codes)
        assert all(f.first_ts >= t["ts"] for f in faults)
        for tok in t["expected"]:
            if tok.startswith("bin:"):
                assert max(bins, key=SEVERITY.get) == tok[4:], (t["kind"], bins)
                checked += 1
        if t["kind"].startswith("xid"):
            assert {f.bin for f in faults if f.code == f"xid:{t['kind'][3:]}"} == {EXPECTED_BIN[int(t["kind"][3:])]}
    assert checked == 3 + len(XID_CODES)  # ecc_dbe, row_remap_failure, gpu_lost, and every xid injection
    injected = {(t["host"], t["gpu_index"]) for t in truth if t["kind"] != "thermal_runaway"}
    assert set(by_gpu) == injected  # no fault anywhere else: background counter noise stays under every limit


def test_each_scenario_kind_yields_exactly_its_faults(run):
    table, _ = run
    firsts = sorted((f.host[-1], f.gpu_index, f.code, f.bin, f.rule) for f in table.faults
                    if f.evidence["emission"] == "first" and not f.code.startswith("xid"))
    assert firsts == [
        ("0", 1, "ecc_dbe", "reset", "counter_dbe"),
        ("0", 1, "row_remap_pending", "reset", "counter_row_remap"),
        ("0", 2, "row_remap_failure", "replace", "counter_row_remap"),
        ("1", 3, "nvlink_crc", "inspect", "counter_nvlink_crc"),
        ("1", 3, "nvlink_recovery", "reset", "counter_nvlink_recovery"),
        ("1", 5, "gpu_lost", "reboot", "gpu_lost"),
        ("2", 0, "pcie_replay", "inspect", "counter_pcie_replay"),
    ]
    [dbe] = [f for f in table.faults if f.code == "ecc_dbe"]
    assert dbe.evidence["ecc_dbe_volatile"] == "0 -> 1" and dbe.first_ts == TS0 + 5
    [lost] = [f for f in table.faults if f.code == "gpu_lost"]
    assert lost.first_ts == TS0 + 9 and lost.evidence["missing_since"] == f"{TS0 + 8:.3f}"  # 2nd sample missing
    xid154 = {(f.gpu_index, f.bin) for f in table.faults if f.code == "xid:154" and f.host.endswith("0")}
    assert xid154 == {(1, "reset"), (2, "reset")}  # the simulator's 154 lines carry the action in the text only


def test_the_lost_gpu_coming_back_is_a_reboot_that_the_next_fatal_fault_remembers(run):
    table, _ = run
    memo = table.data["gpu-node-0001"]["gpus"]["5"]
    assert not memo["lo"] and [how.split(" after")[0] for _, how in memo["b"]] == [f"returned at {TS0 + 28:.3f}"]


def test_a_gpu_missing_from_one_sample_only_is_a_blip():
    t = Table()
    t.feed([host_sample(TS0)])
    t.feed([host_sample(TS0 + 1, seq=1, absent=(4,))])
    t.feed([host_sample(TS0 + 2, seq=2)])
    assert t.faults == [] and t.data["h1"]["gpus"]["4"]["m"] == 0
    t.feed([host_sample(TS0 + 3 + k, seq=3 + k, absent=(4,)) for k in range(5)])
    assert [(f.code, f.gpu_index, f.count) for f in t.faults] == [("gpu_lost", 4, 1)]


@pytest.mark.parametrize("gpu0, expected", [
    ({"ecc_dbe_volatile": None, "ecc_dbe_aggregate": 2}, ("ecc_dbe", "reset", 2)),  # aggregate alone
    ({"ecc_dbe_volatile": 0, "ecc_dbe_aggregate": 0}, None),
    ({"row_remap_pending": True}, ("row_remap_pending", "reset", 1)),
    ({"row_remap_failure": True}, ("row_remap_failure", "replace", 1)),
    ({"nvlink_recovery_errors": 1}, ("nvlink_recovery", "reset", 1)),
    ({"nvlink_crc_errors": 5 + 100}, None),  # 100 in 5 s: not over 10/s x 10 s
    ({"nvlink_crc_errors": 5 + 101}, ("nvlink_crc", "inspect", 1)),
    ({"pcie_replay_count": 3 + 8}, None),  # 8 replays: the limit is more than 8 per minute
    ({"pcie_replay_count": 3 + 9}, ("pcie_replay", "inspect", 1)),
])
def test_counter_rules_fire_on_a_change_against_the_previous_sample(gpu0, expected):
    t = Table()
    t.feed([host_sample(TS0)])
    found = [(f.code, f.bin, f.count) for f in t.feed([host_sample(TS0 + 5, seq=1, gpu0=gpu0)])]
    assert found == ([expected] if expected else [])
    assert t.feed([host_sample(TS0 + 10, seq=2, gpu0=gpu0)]) == []  # the same values again: nothing new


def test_remap_flags_already_set_when_a_gpu_is_first_seen_are_reported_once():
    t = Table()
    t.feed([host_sample(TS0, gpu3={"row_remap_pending": True, "row_remap_failure": True})])
    t.feed([host_sample(TS0 + 5, seq=1, gpu3={"row_remap_pending": True, "row_remap_failure": True})])
    assert sorted((f.code, f.gpu_index) for f in t.faults) == [("row_remap_failure", 3), ("row_remap_pending", 3)]


def test_rates_accumulate_across_samples_and_single_replays_do_not_add_up():
    t = Table()
    slow = [host_sample(TS0 + 15 * k, seq=k, gpu2={"pcie_replay_count": 3 + k}) for k in range(40)]  # 4/min
    for s in slow:
        t.feed([s])
    assert t.faults == []
    fast = [host_sample(TS0 + 1000 + k, seq=100 + k, gpu2={"pcie_replay_count": 42 + 5 * k}) for k in range(6)]
    for s in fast:
        t.feed([s])
    # 5 replays/s: more than 8 within a minute at the second fast sample, and again once 8 more have come
    assert [(f.code, f.ts - TS0, f.evidence["before"], f.evidence["after"]) for f in t.faults] == [
        ("pcie_replay", 1002, "42", "52")]
    assert t.flush()[0].count == 2


def test_a_new_card_in_the_slot_starts_with_no_history():
    t = Table()
    dbe = {"ecc_dbe_aggregate": 1}
    t.feed([host_sample(TS0)])
    t.feed([host_sample(TS0 + 10, seq=1, gpu5=dbe)])
    t.feed([host_sample(TS0 + 7200, seq=2, gpu5={"uuid": "GPU-new", "ecc_dbe_aggregate": 0})])  # swapped
    t.feed([host_sample(TS0 + 7300, seq=3, gpu5={"uuid": "GPU-new", "ecc_dbe_aggregate": 1})])
    assert [(f.gpu_uuid, f.bin) for f in t.faults] == [("GPU-0005", "reset"), ("GPU-new", "reset")]
    t.feed([host_sample(TS0 + 9000, seq=4, gpu5={"uuid": "GPU-new", "ecc_dbe_aggregate": 2})])
    assert (t.faults[-1].bin, t.faults[-1].rule) == ("replace", "escalation_repeat")  # its own second DBE


def test_every_rule_a_fault_names_is_in_the_rule_table_with_its_parameters(run):
    table, _ = run
    rows = {name: (when, params) for name, when, params in rule_table(FaultBinConfig(pcie_replay_per_min=12))}
    assert {f.rule for f in table.faults} <= set(rows) and len(rows) == 26
    assert rows["counter_pcie_replay"][0].startswith("pcie_replay: replays more than 12 in 60 s")
    assert "repeat_n_by_code={'xid:48': 2, 'ecc_dbe': 2, 'ecc_sbe_flood': 2}" in rows["escalation_repeat"][1]
