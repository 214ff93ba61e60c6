"""FakeNvml: pynvml's function surface over recorded readings of a GPU host, with fault injection."""

from __future__ import annotations

import copy
import ctypes
import json
import sys
import threading
import uuid
from collections import Counter, deque
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml
from pynvml import NVMLError

from agents.nvml.fake_faults import UNATTRIBUTED, FaultInjection

H100_HOST = "hgx_h100_8gpu.json"
_CAUSE = {pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "sbe",
          pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "dbe"}
_ECC = {(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): "sbe_volatile",
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): "dbe_volatile",
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): "sbe_aggregate",
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): "dbe_aggregate"}
_NVLINK = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
           pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
_POLICY = {pynvml.NVML_PERF_POLICY_POWER: "power", pynvml.NVML_PERF_POLICY_THERMAL: "thermal",
           pynvml.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost", pynvml.NVML_PERF_POLICY_BOARD_LIMIT: "board_limit",
           pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: "low_utilization",
           pynvml.NVML_PERF_POLICY_RELIABILITY: "reliability"}
_THRESHOLD = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
              "slowdown", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
              pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max"}


def load_readings(path: str | Path | None = None) -> dict:
    """A recorded host (JSON); default: the packaged 8x H100 SXM host."""
    if path is None:
        return json.loads(resources.files("agents.nvml").joinpath("data", H100_HOST).read_text())
    return json.loads(Path(path).read_text())


def _raise(code: int):
    raise NVMLError(code)  # NVMLError.__new__ returns the pynvml subclass for the code, e.g. NVMLError_GpuIsLost


class FakeNvml(FaultInjection):
    """Answers like pynvml (names, signatures, ctypes return types, NVMLError codes) from recorded readings.

    Handles and event sets are real pynvml ctypes pointers. Fault injection mutates the readings or makes a
    function (or a whole device, or the whole library: driver_down) fail with a real NVML return code; `calls`
    counts every function called.
    """

    def __init__(self, readings: dict | str | Path | None = None, *, clocks_event_api: bool = True,
                 library_present: bool = True):
        doc = readings if isinstance(readings, dict) else load_readings(readings)
        self.driver_version: str = doc["driver_version"]
        self.gpus: list[dict] = copy.deepcopy(doc["gpus"])
        self.clocks_event_api, self.library_present = clocks_event_api, library_present
        self.calls: Counter[str] = Counter()
        self._refcount = 0
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in self.gpus]  # keeps handle targets alive
        self._handles = [ctypes.cast(ctypes.pointer(s), pynvml.c_nvmlDevice_t) for s in self._structs]
        self._index = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        self._device_errors: dict[int, int] = {}
        self._library_error: int | None = None  # every call fails with this code (driver_down)
        self._function_errors: dict[tuple[int, str], int] = {}
        self._hangs: dict[tuple[int, str], threading.Event] = {}  # calls that block until released
        self._event_sets: dict[int, tuple[Any, dict[int, int], deque]] = {}

    # -- library ---------------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_present:
            _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self._library_error is not None:
            _raise(self._library_error)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._require_init("nvmlShutdown")
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._require_init("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._require_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index in self._device_errors:
            _raise(self._device_errors[index])
        return self._handles[index]

    def driver_down(self, code: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED) -> None:
        """The driver died under a running agent (a crashed or unloaded kernel module): every NVML call, nvmlInit
        included, answers `code` until `driver_up`. The GPUs may be fine; only the monitor is blind."""
        self._library_error = code

    def driver_up(self) -> None:
        self._library_error = None

    # -- device queries --------------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle) -> str:
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetPciInfo(self, handle):
        g = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = g["pci_bus_id"].encode()
        info.busIdLegacy = g["pci_bus_id"].encode()
        domain, bus, devfn = g["pci_bus_id"].split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(devfn.split(".")[0], 16)
        return info

    def nvmlDeviceGetName(self, handle) -> str:
        return self._gpu(handle)["name"]

    def nvmlDeviceGetUtilizationRates(self, handle):
        g = self._gpu(handle)
        if g["mig_mode"][0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)  # the parent of MIG instances reports no utilisation
        return pynvml.c_nvmlUtilization_t(gpu=g["utilization_pct"]["gpu"], memory=g["utilization_pct"]["memory"])

    def nvmlDeviceGetMemoryInfo(self, handle, version: int | None = None):
        g = self._gpu(handle)
        m = g["memory_bytes"]
        return pynvml.c_nvmlMemory_t(total=m["total"], free=m["free"], used=m["used"])

    def nvmlDeviceGetClockInfo(self, handle, type: int) -> int:
        g = self._gpu(handle)
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM):
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["clocks_mhz"]["sm" if type == pynvml.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        g = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g["temperature_c"]

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold: int) -> int:
        g = self._gpu(handle)
        if threshold not in _THRESHOLD:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["thresholds_c"][_THRESHOLD[threshold]]

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        g = self._gpu(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        known = {pynvml.NVML_FI_DEV_MEMORY_TEMP: g["memory_temperature_c"],
                 pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: g["recovery_action"]}
        for v, field_id in zip(values, fieldIds):
            v.fieldId, v.valueType = field_id, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            reading = known.get(field_id)
            v.nvmlReturn = pynvml.NVML_SUCCESS if reading is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            v.value.uiVal = reading or 0
        return values

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return self._gpu(handle)["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        return self._gpu(handle)["enforced_power_limit_mw"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle) -> int:
        gpu = self._gpu(handle)
        return gpu.get("default_power_limit_mw", gpu["enforced_power_limit_mw"])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        return self._gpu(handle)["total_energy_mj"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        g = self._gpu(handle)
        if not self.clocks_event_api:
            _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # driver older than r535
        return g["clocks_event_reasons"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:
        return self._gpu(handle)["clocks_event_reasons"]

    def nvmlDeviceGetViolationStatus(self, device, perfPolicyType: int):
        g = self._gpu(device)
        if perfPolicyType not in _POLICY:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlViolationTime_t(referenceTime=0, violationTime=g["violation_ns"][_POLICY[perfPolicyType]])

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType: int, counterType: int) -> int:
        return self._gpu(handle)["ecc"][_ECC[(errorType, counterType)]]

    def nvmlDeviceGetRetiredPages(self, device, sourceFilter: int) -> list[int]:
        g = self._gpu(device)
        if g["retired_pages"] is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(g["retired_pages"][_CAUSE[sourceFilter]])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device) -> int:
        g = self._gpu(device)
        if g["retired_pages"] is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(g["retired_pages"]["pending"])

    def nvmlDeviceGetRemappedRows(self, device) -> tuple[int, int, int, int]:
        g = self._gpu(device)
        r = g["remapped_rows"]
        return r["correctable"], r["uncorrectable"], r["pending"], r["failure"]

    def nvmlDeviceGetPcieReplayCounter(self, handle) -> int:
        return self._gpu(handle)["pcie_replay"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle) -> int:
        return self._pcie(self._gpu(handle), "gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle) -> int:
        return self._pcie(self._gpu(handle), "gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle) -> int:
        return self._pcie(self._gpu(handle), "width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle) -> int:
        return self._pcie(self._gpu(handle), "width_max")

    @staticmethod
    def _pcie(g: dict, key: str) -> int:
        if "pcie_link" not in g:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["pcie_link"][key]

    def nvmlDeviceGetRowRemapperHistogram(self, device):
        g = self._gpu(device)
        if "remap_histogram" not in g:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlRowRemapperHistogramValues(**g["remap_histogram"])

    def nvmlDeviceGetGpuFabricInfoV(self, device, gpuFabricInfo) -> int:
        return self._fabric(self._gpu(device), gpuFabricInfo, versioned=True)

    def nvmlDeviceGetGpuFabricInfo(self, device, gpuFabricInfo) -> int:
        return self._fabric(self._gpu(device), gpuFabricInfo, versioned=False)

    @staticmethod
    def _fabric(g: dict, ref, *, versioned: bool) -> int:
        """Fills the struct behind `ref` (ctypes.byref) as the driver does; the versioned call checks its version."""
        if "fabric" not in g:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info, f = ref._obj, g["fabric"]
        if versioned and info.version != pynvml.nvmlGpuFabricInfo_v2:
            _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.state, info.status, info.cliqueId = f["state"], f["status"], f["clique_id"]
        info.clusterUuid[:] = list(uuid.UUID(f["cluster_uuid"]).bytes)
        if versioned:
            info.healthMask = f["health_mask"]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkState(self, device, link: int) -> int:
        g = self._gpu(device)
        if not 0 <= link < g["nvlink"]["links"]:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT if g["nvlink"]["links"] else pynvml.NVML_ERROR_NOT_SUPPORTED)
        down = link in g["nvlink"].get("inactive", ())
        return pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device, link: int, counter: int) -> int:
        g = self._gpu(device)
        if not 0 <= link < g["nvlink"]["links"] or counter not in _NVLINK:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g["nvlink"][_NVLINK[counter]].get(str(link), 0)

    def nvmlDeviceGetMigMode(self, device) -> list[int]:
        g = self._gpu(device)
        return list(g["mig_mode"])

    def nvmlDeviceGetSupportedEventTypes(self, handle) -> int:
        return self._gpu(handle)["supported_event_types"]

    # -- events ----------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._require_init("nvmlEventSetCreate")
        target = pynvml.struct_c_nvmlEventSet_t()
        event_set = ctypes.cast(ctypes.pointer(target), pynvml.c_nvmlEventSet_t)
        self._event_sets[ctypes.addressof(target)] = (target, {}, deque())
        return event_set

    def nvmlDeviceRegisterEvents(self, handle, eventTypes: int, eventSet) -> None:
        g = self._gpu(handle)
        if eventTypes & ~g["supported_event_types"]:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._event_set(eventSet)[1][g["index"]] = eventTypes

    def nvmlEventSetWait_v2(self, eventSet, timeoutms: int):
        self._require_init("nvmlEventSetWait_v2")
        queue = self._event_set(eventSet)[2]
        if not queue:
            _raise(pynvml.NVML_ERROR_TIMEOUT)  # the fake never sleeps: an empty set times out at once
        return queue.popleft()

    def nvmlEventSetFree(self, eventSet) -> None:
        self._require_init("nvmlEventSetFree")
        self._event_sets.pop(ctypes.addressof(eventSet.contents), None)

    # -- plumbing --------------------------------------------------------------------------------------------
    def _require_init(self, name: str) -> None:
        self.calls[name] += 1
        if self._library_error is not None:
            _raise(self._library_error)
        if self._refcount <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle) -> dict:
        """The GPU record behind a handle, after library state and injected faults, as NVML would check them."""
        name = sys._getframe(1).f_code.co_name  # the pynvml function being answered
        self._require_init(name)
        try:
            index = self._index.get(ctypes.addressof(handle.contents))
        except (AttributeError, TypeError, ValueError):  # not a device pointer, or NULL
            index = None
        if index is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._hangs and (index, name) in self._hangs:
            self._hangs[(index, name)].wait()
        code = self._device_errors.get(index) or self._function_errors.get((index, name))
        if code:
            _raise(code)
        return self.gpus[index]

    def _event_set(self, eventSet) -> tuple[Any, dict[int, int], deque]:
        entry = self._event_sets.get(ctypes.addressof(eventSet.contents))
        if entry is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry

    def _emit(self, index: int, event_type: int, data: int, gpu_instance: int = UNATTRIBUTED) -> None:
        for _, registered, queue in self._event_sets.values():
            if registered.get(index, 0) & event_type:
                queue.append(pynvml.c_nvmlEventData_t(
                    device=self._handles[index], eventType=event_type, eventData=data,
                    gpuInstanceId=gpu_instance, computeInstanceId=UNATTRIBUTED))
