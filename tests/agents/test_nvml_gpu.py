"""The NVML collectors on a real GPU (opt-in `gpu` marker); skipped where no NVML library or driver answers."""

from __future__ import annotations

import re
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from agents.nvml import NvmlCollector, NvmlXidCollector  # noqa: E402
from schemas.telemetry import HostSample  # noqa: E402

pytestmark = pytest.mark.gpu
UUID = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
PCI = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@pytest.fixture(scope="module")
def nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVML here: {exc}")
    yield pynvml
    pynvml.nvmlShutdown()


@pytest.fixture
def collector(nvml):
    c = NvmlCollector(host="gpu-test")
    assert c.is_supported(), c.unsupported_reason
    yield c
    c.close()


def test_every_gpu_is_read_and_the_sample_validates(nvml, collector):
    poll = collector.sample()
    sample = HostSample.model_validate_json(poll.sample.model_dump_json(), strict=True)
    assert len(sample.gpus) + len(poll.faults) == nvml.nvmlDeviceGetCount() > 0
    assert poll.faults == [], poll.faults
    assert re.match(r"^\d+\.\d+", sample.driver_version)
    for g in sample.gpus:
        assert UUID.match(g.uuid) and PCI.match(g.pci_bus_id) and g.model
        assert 0 < g.gpu_temp_c < 100
        assert g.hbm_temp_c is None or 0 < g.hbm_temp_c < 110
        assert g.slowdown_temp_c and g.shutdown_temp_c and g.slowdown_temp_c < g.shutdown_temp_c < 120
        assert g.gpu_max_op_temp_c is None or g.gpu_max_op_temp_c <= g.slowdown_temp_c
        assert g.mem_total_mib > 1024 and 0 <= g.mem_used_mib <= g.mem_total_mib
        assert 0 < g.power_w < 2 * g.power_limit_w and 50 <= g.power_limit_w <= 1500
        assert g.power_default_limit_w is None or 50 <= g.power_default_limit_w <= 1500
        assert g.sm_clock_mhz > 0 and g.mem_clock_mhz > 0 and g.throttle_reasons is not None
        assert g.energy_mj is None or g.energy_mj > 0
        assert g.recovery_action in (None, 0)
        assert set(g.unsupported) <= set(type(g).model_fields)
        extras = poll.extras[g.uuid]
        assert extras["mig_mode"] in (None, 0, 1)


def test_counters_move_forward_between_polls(collector):
    first = collector.sample().sample
    time.sleep(1.1)
    second = collector.sample().sample
    assert second.seq == first.seq + 1
    for a, b in zip(first.gpus, second.gpus):
        assert a.uuid == b.uuid
        for counter in ("energy_mj", "ecc_sbe_aggregate", "pcie_replay_count", "nvlink_crc_errors"):
            if getattr(a, counter) is not None and getattr(b, counter) is not None:
                assert getattr(b, counter) >= getattr(a, counter), counter
        if a.energy_mj is not None:
            assert b.energy_mj > a.energy_mj  # a powered GPU always draws something


def test_collector_matches_direct_pynvml_reads(nvml, collector):
    sample = collector.sample().sample
    for g in sample.gpus:
        h = nvml.nvmlDeviceGetHandleByIndex(g.index)
        assert nvml.nvmlDeviceGetUUID(h) == g.uuid
        assert nvml.nvmlDeviceGetTemperatureThreshold(h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == g.slowdown_temp_c
        assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000 == g.power_limit_w
        assert nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000 == g.power_default_limit_w
        old = nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        try:
            new = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except nvml.NVMLError_FunctionNotFound:  # driver older than r535: the collector used `old` itself
            assert collector.devices[g.index].throttle_api == "nvmlDeviceGetCurrentClocksThrottleReasons"
            continue
        assert new & ~0x1 == old & ~0x1  # same bits through both names (idle may flip in between)


def test_xid_channel_registers_and_polls_without_blocking(nvml):
    xids = NvmlXidCollector(host="gpu-test", timeout_ms=50)
    try:
        if not xids.is_supported():
            assert xids.unregistered, xids.unsupported_reason  # every GPU says why
            pytest.skip(f"XID events unavailable here: {xids.unsupported_reason}")
        start = time.monotonic()
        events = xids.sample()
        assert time.monotonic() - start < 1.0
        assert all(e.gpu_uuid is None or UUID.match(e.gpu_uuid) for e in events)
    finally:
        xids.close()
