"""The fake NVML keeps pynvml's contract: names, parameters, return types and error classes; the recording is sane."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest

from agents.nvml.fake import FakeNvml, load_readings
from agents.nvml.lib import Nvml, field_value, normalize_pci_bus_id

PROTOCOL_FUNCTIONS = [n for n in vars(Nvml) if n.startswith("nvml")]


@pytest.mark.parametrize("name", PROTOCOL_FUNCTIONS)
def test_protocol_fake_and_pynvml_agree_on_names_and_parameters(name):
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNvml(), name))
    protocol = inspect.signature(getattr(Nvml, name))
    assert list(fake.parameters) == list(real.parameters)
    assert [p for p in protocol.parameters if p != "self"] == list(real.parameters)


def test_every_call_before_init_is_uninitialized():
    fake = FakeNvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetPowerUsage(handle)


def test_returns_are_pynvml_types():
    fake = FakeNvml()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert isinstance(fake.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert fake.nvmlDeviceGetPciInfo(h).busId == "00000000:2A:00.0" and fake.nvmlDeviceGetPciInfo(h).bus == 0x2A
    values = fake.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t) and field_value(values[0]) == 63
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    event_set = fake.nvmlEventSetCreate()
    assert isinstance(event_set, pynvml.c_nvmlEventSet_t)
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
    fake.xid(1, 31)
    data = fake.nvmlEventSetWait_v2(event_set, 100)
    assert isinstance(data, pynvml.c_nvmlEventData_t) and data.eventData == 31
    assert ctypes.addressof(data.device.contents) == ctypes.addressof(h.contents)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(event_set, 100)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypePowerSourceChange, event_set)


def test_injected_errors_are_the_pynvml_subclasses_with_real_codes():
    fake = FakeNvml()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.fail(0, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(pynvml.NVMLError_NoPermission) as err:
        fake.nvmlDeviceGetPowerUsage(h)
    assert err.value.value == 4 and str(err.value) == "Insufficient Permissions"
    fake.lose_gpu(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUUID(h)
    with pytest.raises(ValueError, match="no function"):
        fake.fail(0, "nvmlDeviceGetPowerUsageTypo")


def test_a_dead_driver_fails_every_call_until_it_is_back():
    fake = FakeNvml()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(2)
    event_set = fake.nvmlEventSetCreate()
    fake.driver_down()
    for call in (lambda: fake.nvmlInit(), lambda: fake.nvmlDeviceGetCount(), lambda: fake.nvmlDeviceGetPowerUsage(h),
                 lambda: fake.nvmlDeviceGetHandleByIndex(2), lambda: fake.nvmlEventSetWait_v2(event_set, 10)):
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            call()
    fake.driver_up()
    assert fake.nvmlDeviceGetPowerUsage(h) == fake.gpus[2]["power_mw"] and fake.nvmlDeviceGetCount() == 8


def test_recording_is_an_hgx_h100_host_with_reference_values():
    doc = load_readings()
    gpus = doc["gpus"]
    assert len(gpus) == 8 and len({g["uuid"] for g in gpus}) == 8
    assert [normalize_pci_bus_id(g["pci_bus_id"]) for g in gpus] == [
        "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
    for g in gpus:
        assert g["thresholds_c"] == {"shutdown": 92, "slowdown": 89, "mem_max": 95, "gpu_max": 87}
        assert g["enforced_power_limit_mw"] == 700_000 and 0 < g["power_mw"] <= 700_000
        assert g["memory_bytes"]["total"] == 81559 * 2**20
        assert g["memory_bytes"]["used"] + g["memory_bytes"]["free"] == g["memory_bytes"]["total"]
        assert g["clocks_mhz"] == {"sm": 1980, "mem": 2619} and g["nvlink"]["links"] == 18
        assert g["temperature_c"] < g["thresholds_c"]["gpu_max"] and g["memory_temperature_c"] < 95


@pytest.mark.parametrize("raw, expected", [
    ("00000000:1A:00.0", "0000:1a:00.0"), ("0000:18:00.0", "0000:18:00.0"), ("PCI:0000:2b:00", "0000:2b:00.0"),
    (b"00000019:01:00.0", "0019:01:00.0"), ("garbage", "garbage"), ("0000:zz:00.0", "0000:zz:00.0"),
    ("1A:00.0", "0000:1a:00.0"),  # no domain: 0, as the kernel log's ids read (schemas.pci.normalize_pci)
])
def test_pci_bus_id_normalisation(raw, expected):
    assert normalize_pci_bus_id(raw) == expected
