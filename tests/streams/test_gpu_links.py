"""Faults with no Xid in a GPU's own readings: a corrected-error flood, a PCIe link trained down, NVLink links gone
inactive, a fabric that failed: from the NVML collector's readings (FakeNvml) and from simulator scenarios."""

from __future__ import annotations

import pytest

from agents.nvml.collector import NvmlCollector
from agents.nvml.fake import FakeNvml
from agents.simulator import FleetSimulator
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.counters import apply_sample
from streams.fault_bins.gpu_links import health_faults
from streams.fault_bins.host_state import HostState
from streams.fault_bins.rules import check_record
from tests.streams.test_fault_bins import TS0, Table

NEW_CODES = {"ecc_sbe_flood", "pcie_downtrained", "nvlink_down", "fabric_failed"}


class Host:
    """One FakeNvml host read by the real collector every 10 s, its samples fed to the fault-bin rules."""

    def __init__(self, config: FaultBinConfig | None = None):
        self.now, self.nvml = TS0, FakeNvml()
        self.collector = NvmlCollector(self.nvml, host="h1", clock=lambda: self.now)
        self.state, self.config = HostState(), config or FaultBinConfig()

    def tick(self, n: int = 1) -> list:
        found = []
        for _ in range(n):
            self.now += 10.0
            self.nvml.advance(10.0)
            sample = self.collector.sample().sample.model_dump(mode="json")
            found += apply_sample(self.state, "h1", sample, self.config)
        return found


def test_the_collector_reads_links_spare_rows_and_fabric_from_nvml():
    host = Host()
    host.nvml.pcie_train_down(2, width=8)
    host.nvml.nvlink_down(3, 0, 5)
    host.nvml.spend_spare_rows(4, 3, to="low")
    g = {r.index: r for r in host.collector.sample().sample.gpus}
    assert (g[0].pcie_link_gen, g[0].pcie_link_gen_max, g[0].pcie_link_width, g[0].pcie_link_width_max) == \
        (5, 5, 16, 16)
    assert g[2].pcie_link_width == 8
    assert (g[3].nvlink_links, g[3].nvlink_active_mask) == (18, (1 << 18) - 1 - 1 - (1 << 5))
    assert (g[4].remap_banks_max, g[4].remap_banks_low, g[4].remap_banks_none) == (2557, 3, 0)
    assert (g[0].fabric_status, g[0].fabric_clique_id, g[0].fabric_health_mask) == (3, 32766, 0)
    assert g[0].fabric_cluster_uuid == "6f1c2a4e-9b3d-4c1e-8a57-2d9e0b7c4f31"


def test_a_driver_without_the_versioned_fabric_call_is_read_through_the_old_one_and_no_fabric_is_none():
    host = Host()
    host.nvml.unsupported(0, "nvmlDeviceGetGpuFabricInfoV")  # NOT_SUPPORTED: no fabric on this GPU
    for i in range(1, 8):
        host.nvml.fail(i, "nvmlDeviceGetGpuFabricInfoV", 13)  # FUNCTION_NOT_FOUND: an r535 driver
    g = {r.index: r for r in host.collector.sample().sample.gpus}
    assert g[0].fabric_status is None and "fabric_status" in g[0].unsupported
    assert (g[1].fabric_status, g[1].fabric_health_mask) == (3, None)  # the old struct has no health mask


def test_a_corrected_error_flood_like_dcgm_issue_313_is_a_gpu_incident_at_the_next_sample():
    host = Host()
    host.tick(3)
    host.nvml.corrected_errors(5, 177_000)  # 17,700 a second for 10 s; NVML and DCGM call the GPU healthy
    [fault] = host.tick()
    assert (fault.code, fault.bin, fault.gpu, fault.rule) == ("ecc_sbe_flood", "reset", "5", "counter_ecc_sbe_flood")
    assert "177000 corrected ECC errors" in fault.reasons[0] and fault.evidence["field"] == "ecc_sbe_volatile"
    host.nvml.corrected_errors(5, 30)  # a trickle after it: under 10/s
    assert host.tick(6) == []


def test_a_pcie_link_below_its_width_is_a_fault_after_a_minute_and_told_once():
    host = Host()
    host.tick(2)
    host.nvml.pcie_train_down(2, width=8)
    assert host.tick(6) == []  # 50 s: not yet
    [fault] = host.tick()
    assert (fault.code, fault.bin, fault.action) == ("pcie_downtrained", "inspect", "CHECK_MECHANICALS")
    assert "x8 of x16" in fault.reasons[0] and fault.evidence["samples"] == "7"
    assert host.tick(10) == []  # the same episode: told once


def test_a_lower_pcie_generation_counts_only_on_a_busy_gpu():
    host = Host()
    host.nvml.pcie_train_down(1, gen=3)
    host.nvml.gpus[1]["utilization_pct"]["gpu"] = 0  # idle: a GPU may slow its link to save power
    assert host.tick(10) == []
    host.nvml.gpus[1]["utilization_pct"]["gpu"] = 97
    found = host.tick(8)
    assert [(f.code, f.gpu) for f in found] == [("pcie_downtrained", "1")]
    assert "Gen3 of Gen5 while 97 % busy" in found[0].reasons[0]


def test_nvlink_links_gone_inactive_are_a_fault_against_the_gpu_itself_and_against_its_peers():
    host = Host()
    host.tick(2)
    host.nvml.nvlink_down(6)  # every link of GPU 6, after it ran with 18
    [fault] = host.tick(7)
    assert (fault.code, fault.bin, fault.gpu) == ("nvlink_down", "reset", "6")
    assert fault.evidence["active"] == "0" and fault.evidence["expected"] == "18"
    fresh = Host()
    fresh.nvml.nvlink_down(4, 1, 2)  # from the first sample: its peers say what it should have
    [fault] = fresh.tick(8)
    assert (fault.code, fault.gpu) == ("nvlink_down", "4") and "inactive: 1,2" in fault.reasons[0]


def test_a_host_whose_gpus_all_start_without_links_has_nothing_to_compare_with():
    host = Host()
    for i in range(8):
        host.nvml.nvlink_down(i)
    assert host.tick(10) == []


def test_a_failed_fabric_is_a_fault_at_once_and_a_trained_fabric_lost_after_a_minute():
    host = Host()
    host.tick()
    host.nvml.fabric_failure(0)
    host.nvml.gpus[1]["fabric"]["health_mask"] = 2 << 14  # the Fabric Manager disconnected
    host.nvml.gpus[2]["fabric"]["state"] = 2  # training again (in progress) after it was done
    found = host.tick()
    assert sorted((f.code, f.gpu, f.bin) for f in found) == [("fabric_failed", "0", "reboot"),
                                                             ("fabric_failed", "1", "reboot")]
    assert "Fabric Manager disconnected" in next(f for f in found if f.gpu == "1").reasons[0]
    [lost] = host.tick(7)
    assert lost.gpu == "2" and "in progress" in lost.reasons[0] and "after it was trained" in lost.reasons[0]


def test_health_mask_parts_decode_as_nvml_packs_them():
    assert health_faults(0) == [] and health_faults(None) == []
    assert health_faults(1 << 4) == ["routes unhealthy"]
    assert health_faults((3 << 8) | (2 << 14)) == ["incorrect configuration", "Fabric Manager disconnected"]
    assert health_faults((1 << 8) | (1 << 14) | 1) == []  # no misconfiguration, connected, degraded bandwidth only


def test_a_reset_forgets_the_episode_so_a_link_still_down_after_it_is_told_again():
    host = Host()
    host.tick()
    host.nvml.pcie_train_down(3, width=4)
    assert [f.code for f in host.tick(8)] == ["pcie_downtrained"]
    host.nvml.require_reset(3)
    host.tick(2)  # out of the samples: lost
    host.nvml.restore_gpu(3)  # back after a reset, its link still at x4
    assert [f.code for f in host.tick(8)] == ["pcie_downtrained"]


def test_the_link_memory_survives_the_state_round_trip():
    host = Host()
    host.tick()
    host.nvml.pcie_train_down(3, width=4)
    host.tick(3)
    again = HostState.from_json(host.state.to_json())
    memo = again.gpus["3"]
    assert memo.links == 18 and memo.fabric_ok and memo.ep["pcie"][1] == 3 and again.to_json() == host.state.to_json()


SCENARIO = {"name": "gpu-links", "faults": [
    {"kind": "ecc_flood", "at": 100, "host": 0, "gpu": 1},
    {"kind": "ecc_flood", "at": 100, "host": 0, "gpu": 2, "rate_per_s": 0.005},  # 18 an hour: nothing
    {"kind": "pcie_downtrain", "at": 50, "host": 1, "gpu": 3},
    {"kind": "pcie_downtrain", "at": 50, "host": 2, "gpu": 4, "width": None, "gen": 3},  # runs a job: busy
    {"kind": "nvlink_inactive", "at": 200, "host": 3, "gpu": 5, "links": 4},
    {"kind": "nvlink_inactive", "at": 0, "host": 4, "gpu": 0},  # from the start: its peers show it
    {"kind": "nvlink_inactive", "at": 0, "host": 5},  # the whole host from the start: nothing shows it
    {"kind": "fabric_down", "at": 300, "host": 6},
    {"kind": "pcie_downtrain", "at": 400, "duration": 30, "host": 7, "gpu": 0},  # gone before a minute: nothing
]}


@pytest.fixture(scope="module")
def scenario_run():
    sim = FleetSimulator(10, seed=5, start_ts=TS0, scenario=SCENARIO, interval=10.0, nccl_interval=0)
    table, truth = Table(), []
    for _ in range(60):
        tick = sim.step()
        truth += tick.truth
        table.feed([check_record(s, "sample") for s in tick.samples])
    return table, truth


def test_each_injection_raises_what_its_truth_expects_and_nothing_else(scenario_run):
    table, truth = scenario_run
    raised: dict[tuple, set] = {}
    for f in table.faults:
        raised.setdefault((f.host, f.gpu_index), set()).add(f.code)
    wanted: dict[tuple, set] = {}
    allowed: dict[tuple, set] = {}
    for t in truth:
        gpus = [t["gpu_index"]] if t["gpu_index"] is not None else range(8)
        for gpu in gpus:
            for tokens, into in ((t["expected"], wanted), (t["allowed"], allowed)):
                codes = {tok[6:] for tok in tokens if tok.startswith("fault:")}
                if codes:
                    into.setdefault((t["host"], gpu), set()).update(codes)
    assert set(raised) == set(wanted)  # every GPU hit raised, no other GPU did
    for where, codes in raised.items():
        assert wanted[where] <= codes <= wanted[where] | allowed.get(where, set()), (where, codes)
    assert {(f.code, f.bin) for f in table.faults if f.code in NEW_CODES} == {
        ("ecc_sbe_flood", "reset"), ("pcie_downtrained", "inspect"), ("nvlink_down", "reset"),
        ("fabric_failed", "reboot")}
    kinds = {t["kind"]: t for t in truth}
    assert len(wanted) == 5 + 8  # a flood, two PCIe links, two NVLink GPUs; a fabric down on all 8 GPUs of its host
    assert {code for codes in raised.values() for code in codes} - {"ecc_trend"} == NEW_CODES
    assert kinds["fabric_down"]["hardware"] is True


def test_the_flood_is_caught_at_the_first_sample_after_it_starts(scenario_run):
    table, truth = scenario_run
    [flood] = [f for f in table.faults if f.code == "ecc_sbe_flood"]
    start = next(t["ts"] for t in truth if t["kind"] == "ecc_flood" and t["gpu_index"] == 1)
    assert flood.first_ts - start <= 10.0
