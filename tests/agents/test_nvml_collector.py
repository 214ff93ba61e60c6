"""NvmlCollector against the fake NVML: every field, every fault injection, and the error mapping."""

from __future__ import annotations

import copy

import pynvml
import pytest

from agents.nvml import DeviceFault, NvmlCollector, NvmlUnavailableError
from agents.nvml.fake import FakeNvml, load_readings
from agents.nvml.fake_faults import HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP
from schemas.telemetry import HostSample

RETIRED = ["retired_pages_dbe", "retired_pages_pending", "retired_pages_sbe"]  # Hopper: NOT_SUPPORTED


class Clock:
    def __init__(self, t: float = 1_760_000_000.0):
        self.t = t

    def __call__(self) -> float:
        self.t += 10.0
        return self.t


def strict(sample: HostSample) -> HostSample:
    """Every sample must survive a strict round trip through the wire form."""
    again = HostSample.model_validate_json(sample.model_dump_json(), strict=True)
    assert again == sample
    return sample


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def collector(fake) -> NvmlCollector:
    c = NvmlCollector(fake, host="gpu-node-0001", rack="r01", cluster="c1", clock=Clock())
    yield c
    c.close()


def gpu(sample: HostSample, index: int):
    return next(g for g in sample.gpus if g.index == index)


def test_every_field_of_every_gpu_matches_the_recording(collector):
    recorded = load_readings()
    poll = collector.sample()
    sample = strict(poll.sample)
    assert (sample.host, sample.rack, sample.cluster, sample.source, sample.seq) == ("gpu-node-0001", "r01", "c1",
                                                                                     "nvml", 0)
    assert sample.driver_version == recorded["driver_version"] == "550.90.07"
    assert [g.index for g in sample.gpus] == list(range(8)) and poll.faults == []
    for g, rec in zip(sample.gpus, recorded["gpus"]):
        assert g.uuid == rec["uuid"] and g.model == "NVIDIA H100 80GB HBM3"
        assert g.pci_bus_id == rec["pci_bus_id"][4:].lower()  # '00000000:2A:00.0' -> '0000:2a:00.0'
        assert g.gpu_util_pct == rec["utilization_pct"]["gpu"] and g.mem_util_pct == rec["utilization_pct"]["memory"]
        assert g.mem_total_mib == 81559.0 and g.mem_used_mib == rec["memory_bytes"]["used"] / 2**20
        assert (g.sm_clock_mhz, g.mem_clock_mhz) == (1980.0, 2619.0)
        assert g.gpu_temp_c == rec["temperature_c"] and g.hbm_temp_c == rec["memory_temperature_c"]
        assert g.power_w == rec["power_mw"] / 1000 and g.power_limit_w == g.power_default_limit_w == 700.0
        assert g.energy_mj == rec["total_energy_mj"] and g.throttle_reasons == 0
        assert (g.shutdown_temp_c, g.slowdown_temp_c, g.gpu_max_op_temp_c, g.hbm_max_op_temp_c) == (92, 89, 87, 95)
        assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile, g.ecc_dbe_aggregate) == (0, 0, 0)
        assert g.ecc_sbe_aggregate == rec["ecc"]["sbe_aggregate"]
        assert g.remapped_rows_correctable == rec["remapped_rows"]["correctable"]
        assert (g.remapped_rows_uncorrectable, g.row_remap_pending, g.row_remap_failure) == (0, False, False)
        assert g.pcie_replay_count == rec["pcie_replay"] and g.recovery_action == 0
        assert (g.sm_active, g.tensor_active, g.last_xid) == (None, None, None)  # not NVML quantities
        assert g.retired_pages_sbe is None and g.unsupported == RETIRED
    assert gpu(sample, 3).ecc_sbe_aggregate == 2 and gpu(sample, 6).pcie_replay_count == 3
    assert (gpu(sample, 2).nvlink_crc_errors, gpu(sample, 2).nvlink_replay_errors) == (5, 2)
    assert gpu(sample, 0).nvlink_crc_errors == gpu(sample, 0).nvlink_recovery_errors == 0
    extras = poll.extras[gpu(sample, 0).uuid]
    assert extras["mig_mode"] == 0 and extras["violation_ns"]["power"] == 311_804_000_000


def test_seq_and_clock_advance_and_energy_integrates(collector, fake):
    first = collector.sample().sample
    fake.advance(10.0)
    second = collector.sample().sample
    assert (first.seq, second.seq) == (0, 1) and second.ts == first.ts + 10.0
    g0, g1 = gpu(first, 0), gpu(second, 0)
    assert g1.energy_mj - g0.energy_mj == int(g0.power_w * 1000 * 10)


def test_current_clocks_event_api_is_used_when_present(collector, fake):
    collector.sample()
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 8
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0
    assert {d.throttle_api for d in collector.devices} == {"nvmlDeviceGetCurrentClocksEventReasons"}


def test_driver_before_r535_falls_back_to_the_deprecated_throttle_api():
    fake = FakeNvml(clocks_event_api=False)  # the new entry point answers FUNCTION_NOT_FOUND
    fake.throttle(4, SW_POWER_CAP, power_w=699.5)
    collector = NvmlCollector(fake, host="old-driver")
    sample = strict(collector.sample().sample)
    assert gpu(sample, 4).throttle_reasons == SW_POWER_CAP and gpu(sample, 0).throttle_reasons == 0
    assert "throttle_reasons" not in gpu(sample, 4).unsupported
    collector.sample()
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 8  # tried once per GPU, then never again
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 16
    assert {d.throttle_api for d in collector.devices} == {"nvmlDeviceGetCurrentClocksThrottleReasons"}


def test_hw_thermal_and_sw_power_cap_throttling(collector, fake):
    fake.throttle(5, HW_THERMAL | HW_SLOWDOWN, temp_c=91, hbm_temp_c=96, sm_clock_mhz=990)
    fake.throttle(1, SW_POWER_CAP, power_w=699.8, sm_clock_mhz=1755)
    fake.advance(60.0)
    poll = collector.sample()
    hot, capped = gpu(poll.sample, 5), gpu(poll.sample, 1)
    assert hot.throttle_reasons == 0x48 and hot.gpu_temp_c == 91 and hot.hbm_temp_c == 96 and hot.sm_clock_mhz == 990
    assert hot.gpu_temp_c > hot.slowdown_temp_c and hot.hbm_temp_c > hot.hbm_max_op_temp_c
    assert capped.throttle_reasons == pynvml.nvmlClocksThrottleReasonSwPowerCap and capped.power_w == 699.8
    assert poll.extras[hot.uuid]["violation_ns"]["thermal"] == 60_000_000_000
    assert poll.extras[capped.uuid]["violation_ns"]["power"] == 311_804_000_000 + 7_000_000_000 + 60_000_000_000
    strict(poll.sample)


def test_ecc_double_bit_error(collector, fake):
    fake.double_bit_error(2, count=3)
    g = gpu(strict(collector.sample().sample), 2)
    assert (g.ecc_dbe_volatile, g.ecc_dbe_aggregate) == (3, 3)
    assert gpu(collector.sample().sample, 1).ecc_dbe_volatile == 0


def test_row_remap_pending_then_failure(collector, fake):
    fake.row_remap(6)
    g = gpu(strict(collector.sample().sample), 6)
    assert (g.remapped_rows_uncorrectable, g.row_remap_pending, g.row_remap_failure) == (1, True, False)
    fake.row_remap(6, failure=True)
    g = gpu(strict(collector.sample().sample), 6)
    assert (g.remapped_rows_uncorrectable, g.row_remap_failure) == (2, True)


def test_unsupported_and_no_permission_are_none_and_flagged_and_not_asked_again(collector, fake):
    fake.unsupported(0, "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetRemappedRows")
    fake.fail(1, "nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NO_PERMISSION)
    fake.fail(2, "nvmlDeviceGetNvLinkErrorCounter", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample = strict(collector.sample().sample)
    g0, g1, g2 = gpu(sample, 0), gpu(sample, 1), gpu(sample, 2)
    assert g0.pcie_replay_count is None and g0.remapped_rows_uncorrectable is None and g0.row_remap_pending is None
    assert g0.unsupported == sorted(RETIRED + ["pcie_replay_count", "remapped_rows_correctable",
                                               "remapped_rows_uncorrectable", "row_remap_failure", "row_remap_pending"])
    assert g1.energy_mj is None and "energy_mj" in g1.unsupported and g1.power_w is not None
    assert g2.nvlink_crc_errors is g2.nvlink_replay_errors is g2.nvlink_recovery_errors is None
    assert {"nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors"} <= set(g2.unsupported)
    before = fake.calls["nvmlDeviceGetPcieReplayCounter"]
    assert gpu(collector.sample().sample, 0).unsupported == g0.unsupported
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == before + 7  # GPU 0 is not asked again


def test_transient_error_is_none_but_not_unsupported(collector, fake):
    fake.fail(3, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT)
    g = gpu(strict(collector.sample().sample), 3)
    assert g.power_w is None and "power_w" not in g.unsupported
    assert collector.errors == {"gpu3:power_w:NVMLError_Timeout": 1}
    fake.heal(3)
    assert gpu(collector.sample().sample, 3).power_w == 641.03


def test_field_values_unknown_to_an_older_driver(collector, fake):
    fake.gpus[0]["recovery_action"] = None  # per-value NOT_SUPPORTED inside a successful call
    g = gpu(strict(collector.sample().sample), 0)
    assert g.recovery_action is None and "recovery_action" in g.unsupported and g.hbm_temp_c == 61
    fake.gpus[1]["recovery_action"] = 9  # an enum value newer than the schema's 0..7
    assert gpu(collector.sample().sample, 1).recovery_action is None


@pytest.mark.parametrize("inject, kind, code", [
    ("lose_gpu", "gpu_lost", pynvml.NVML_ERROR_GPU_IS_LOST),
    ("require_reset", "reset_required", pynvml.NVML_ERROR_RESET_REQUIRED),
    ("wedge", "unknown_error", pynvml.NVML_ERROR_UNKNOWN),
])
def test_a_faulted_gpu_is_absent_and_reported_once(collector, fake, inject, kind, code):
    uuid = fake.gpus[3]["uuid"]
    collector.sample()
    getattr(fake, inject)(3)
    poll = collector.sample()
    assert [g.index for g in strict(poll.sample).gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert poll.faults == [DeviceFault(kind, 3, uuid, "0000:5d:00.0", code, pynvml.nvmlExceptionClass(code).__name__,
                                       poll.faults[0].call, poll.sample.ts)]
    again = collector.sample()
    assert again.faults == [] and 3 not in [g.index for g in again.sample.gpus]  # edge-triggered
    assert collector.active_faults[3].kind == kind
    fake.restore_gpu(3)
    back = collector.sample()
    assert gpu(strict(back.sample), 3).uuid == uuid and back.faults == [] and collector.active_faults == {}


def test_gpu_lost_before_start_is_reported_on_the_first_poll():
    fake = FakeNvml()
    fake.lose_gpu(7)
    poll = NvmlCollector(fake, host="h").sample()
    assert len(poll.sample.gpus) == 7
    assert [(f.kind, f.gpu_index, f.uuid, f.call) for f in poll.faults] == [
        ("gpu_lost", 7, None, "nvmlDeviceGetHandleByIndex")]


def test_mig_enabled_is_reported_and_utilisation_becomes_unsupported(collector, fake):
    collector.sample()
    fake.enable_mig(4)
    poll = collector.sample()
    g = gpu(strict(poll.sample), 4)
    assert poll.extras[g.uuid]["mig_mode"] == 1 and poll.extras[g.uuid]["mig_pending"] == 1
    assert g.gpu_util_pct is None and {"gpu_util_pct", "mem_util_pct"} <= set(g.unsupported)
    assert g.mem_used_mib is not None and g.power_w is not None
    fake.enable_mig(4, enabled=False)
    g = gpu(collector.sample().sample, 4)  # MIG mode changed: utilisation is asked again
    assert g.gpu_util_pct == 99 and "gpu_util_pct" not in g.unsupported


def test_retired_pages_on_a_gpu_that_retires_pages():
    readings = copy.deepcopy(load_readings())
    readings["gpus"][0]["retired_pages"] = {"sbe": [0x1A2B000, 0x2C3D000], "dbe": [0x77E1000], "pending": 1}
    g = gpu(strict(NvmlCollector(FakeNvml(readings), host="v100").sample().sample), 0)
    assert (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) == (2, 1, True)
    assert g.unsupported == []


def test_pcie_gpu_without_nvlink_reports_nvlink_unsupported():
    readings = copy.deepcopy(load_readings())
    readings["gpus"][0]["nvlink"]["links"] = 0
    g = gpu(NvmlCollector(FakeNvml(readings), host="pcie").sample().sample, 0)
    assert g.nvlink_crc_errors is None and "nvlink_replay_errors" in g.unsupported


def test_last_xid_comes_from_the_injected_source(fake):
    latest = {fake.gpus[2]["uuid"]: 94}
    sample = NvmlCollector(fake, host="h", last_xid=latest.get).sample().sample
    assert gpu(sample, 2).last_xid == 94 and gpu(sample, 0).last_xid is None


def test_no_library_is_unsupported_not_a_crash():
    collector = NvmlCollector(FakeNvml(library_present=False), host="cpu-only")
    assert collector.is_supported() is False
    assert collector.unsupported_reason == "nvmlInit: NVMLError_LibraryNotFound"
    with pytest.raises(NvmlUnavailableError):
        collector.sample()


def test_driver_unloaded_mid_run_is_a_retryable_host_error(collector, fake):
    collector.sample()
    fake.fail(0, "nvmlDeviceGetMigMode", pynvml.NVML_ERROR_UNINITIALIZED)
    with pytest.raises(NvmlUnavailableError) as err:
        collector.sample()
    assert err.value.retryable


def test_close_shuts_nvml_down(fake):
    collector = NvmlCollector(fake, host="h")
    collector.sample()
    collector.close()
    assert fake.calls["nvmlShutdown"] == 1 and fake._refcount == 0


def test_throttle_time_counters_and_mig_mode_reach_the_published_sample():
    from agents.nvml import NvmlCollector
    from agents.nvml.fake import FakeNvml

    collector = NvmlCollector(FakeNvml(), host="h")
    a = collector.sample().sample.gpus[0]
    b = collector.sample().sample.gpus[0]
    assert a.throttle_power_ns is not None and a.throttle_thermal_ns is not None
    assert a.mig_enabled is False and "mig_enabled" not in a.unsupported
    assert b.throttle_power_ns >= a.throttle_power_ns  # cumulative counters never go backwards
