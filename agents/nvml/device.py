"""One GPU through NVML: identity and limits read once, then every GpuReading field on each poll."""

from __future__ import annotations

import ctypes
import uuid
from collections import Counter
from typing import Any, Callable

import pynvml
from pynvml import NVMLError

from agents.nvml.lib import (
    DEVICE_FAULTS, HOST_FAULTS, UNSUPPORTED_CODES, FaultKind, Nvml, NvmlUnavailableError, error_code, error_name,
    field_value, normalize_pci_bus_id, text,
)
from schemas.telemetry import FABRIC_FAILURE, FABRIC_SUCCESS, GpuReading

MIB = 1024 * 1024
# Read groups that fill more than one GpuReading field; every other group is named after the one field it fills.
GROUP_FIELDS = {
    "utilization": ("gpu_util_pct", "mem_util_pct"),
    "memory": ("mem_used_mib", "mem_total_mib"),
    "remapped_rows": ("remapped_rows_correctable", "remapped_rows_uncorrectable", "row_remap_pending",
                      "row_remap_failure"),
    "violation_power": ("throttle_power_ns",),
    "violation_thermal": ("throttle_thermal_ns",),
    "mig_mode": ("mig_enabled",),
    "remap_histogram": ("remap_banks_max", "remap_banks_high", "remap_banks_partial", "remap_banks_low",
                        "remap_banks_none"),
    "fabric": ("fabric_status", "fabric_clique_id", "fabric_cluster_uuid", "fabric_health_mask"),
    "nvlink_state": ("nvlink_links", "nvlink_active_mask"),
}
PCIE_LIMITS = {  # GpuReading field -> the NVML function that reads it once, at open: what the GPU and its slot allow
    "pcie_link_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_link_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
}
LIMITS = {  # GpuReading field -> nvmlTemperatureThresholds_t
    "shutdown_temp_c": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "slowdown_temp_c": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "gpu_max_op_temp_c": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
    "hbm_max_op_temp_c": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
}
ECC = {  # GpuReading field -> (nvmlMemoryErrorType_t, nvmlEccCounterType_t)
    "ecc_sbe_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    "ecc_dbe_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    "ecc_sbe_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    "ecc_dbe_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}
NVLINK = {  # GpuReading field -> nvmlNvLinkErrorCounter_t values summed over every active link
    "nvlink_crc_errors": (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    "nvlink_replay_errors": (pynvml.NVML_NVLINK_ERROR_DL_REPLAY,),
    "nvlink_recovery_errors": (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,),
}
VIOLATIONS = {  # throttle-time counter (ns since driver load) -> nvmlPerfPolicyType_t
    "power": pynvml.NVML_PERF_POLICY_POWER,
    "thermal": pynvml.NVML_PERF_POLICY_THERMAL,
    "sync_boost": pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": pynvml.NVML_PERF_POLICY_RELIABILITY,
}
FIELD_IDS = {"hbm_temp_c": pynvml.NVML_FI_DEV_MEMORY_TEMP,
             "recovery_action": pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION}
_READING = frozenset(GpuReading.model_fields)
# An unknown field id on an older driver comes back per value as INVALID_ARGUMENT.
FIELD_UNSUPPORTED = UNSUPPORTED_CODES | {pynvml.NVML_ERROR_INVALID_ARGUMENT}


class DeviceFaultError(Exception):
    """Internal signal: an NVML call said this GPU is lost, needs a reset, or answered UNKNOWN."""

    def __init__(self, kind: FaultKind, code: int, call: str):
        super().__init__(f"{call}: {error_name(code)}")
        self.kind, self.code, self.call = kind, code, call


class NvmlDevice:
    """Reads one GPU by index. Unsupported read groups are remembered and not asked again until MIG mode changes."""

    def __init__(self, nvml: Nvml, index: int):
        self.nvml, self.index = nvml, index
        self.handle: Any = None
        self.uuid: str | None = None
        self.pci_bus_id: str | None = None
        self.model: str | None = None
        self.limits: dict[str, float | None] = {}
        self.links: tuple[int, ...] = ()  # active at open: their error counters are summed
        self.link_ids: tuple[int, ...] = ()  # every link the GPU has (answered a state query at open)
        self.unsupported: set[str] = set()
        self.errors: Counter[str] = Counter()  # transient errors, "group:NVMLError_Name"
        self.mig_mode: int | None = None
        self.call: str | None = None  # the NVML function last called: where a poll that hangs is stuck
        current = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons: Callable[[Any], int] = current or nvml.nvmlDeviceGetCurrentClocksThrottleReasons

    @property
    def throttle_api(self) -> str:
        return self._reasons.__name__

    def open(self) -> None:
        """Handle, identity, limits and active NVLink links; raises DeviceFaultError if the GPU is not usable."""
        self.unsupported.clear()
        self.handle = None
        handle = self._fault_checked("handle", self.nvml.nvmlDeviceGetHandleByIndex, self.index)
        self.handle = handle
        self.uuid = text(self._fault_checked("uuid", self.nvml.nvmlDeviceGetUUID, handle))
        self.pci_bus_id = normalize_pci_bus_id(self._fault_checked("pci", self.nvml.nvmlDeviceGetPciInfo, handle).busId)
        name = self._get("model", self.nvml.nvmlDeviceGetName)
        self.model = text(name) if name is not None else None
        self.limits = {f: self._num(self._get(f, self.nvml.nvmlDeviceGetTemperatureThreshold, t))
                       for f, t in LIMITS.items()}
        default = self._get("power_default_limit_w", self.nvml.nvmlDeviceGetPowerManagementDefaultLimit)
        self.limits["power_default_limit_w"] = default / 1000.0 if default is not None else None
        for field, fn in PCIE_LIMITS.items():
            self.limits[field] = self._get(field, getattr(self.nvml, fn))
        links, present = [], []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self.nvml.nvmlDeviceGetNvLinkState(handle, link)
            except NVMLError as exc:
                self._fault_or_none(exc, "nvlink_probe")  # beyond the device's links: INVALID_ARGUMENT
                continue
            present.append(link)
            if state == pynvml.NVML_FEATURE_ENABLED:
                links.append(link)
        self.links, self.link_ids = tuple(links), tuple(present)
        if not self.links:
            self.unsupported.update(NVLINK)
        if not self.link_ids:
            self.unsupported.add("nvlink_state")

    def read(self) -> tuple[dict, dict]:
        """(GpuReading fields, extras the schema has no column for). Raises DeviceFaultError or NvmlUnavailableError."""
        nvml, get = self.nvml, self._get
        mig = get("mig_mode", nvml.nvmlDeviceGetMigMode)
        mig_now = int(mig[0]) if mig is not None else None
        if mig_now != self.mig_mode and self.mig_mode is not None:
            self.unsupported -= {"utilization", "memory"}  # MIG changes what the parent device answers
        self.mig_mode = mig_now
        r: dict[str, Any] = {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id,
                             "model": self.model, **self.limits}
        util = get("utilization", nvml.nvmlDeviceGetUtilizationRates)
        r["gpu_util_pct"], r["mem_util_pct"] = (float(util.gpu), float(util.memory)) if util else (None, None)
        mem = get("memory", nvml.nvmlDeviceGetMemoryInfo)
        r["mem_used_mib"], r["mem_total_mib"] = (mem.used / MIB, mem.total / MIB) if mem is not None else (None, None)
        r["sm_clock_mhz"] = self._num(get("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM))
        r["mem_clock_mhz"] = self._num(get("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM))
        r["gpu_temp_c"] = self._num(get("gpu_temp_c", nvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU))
        power = get("power_w", nvml.nvmlDeviceGetPowerUsage)
        r["power_w"] = power / 1000.0 if power is not None else None
        limit = get("power_limit_w", nvml.nvmlDeviceGetEnforcedPowerLimit)
        r["power_limit_w"] = limit / 1000.0 if limit is not None else None
        r["energy_mj"] = get("energy_mj", nvml.nvmlDeviceGetTotalEnergyConsumption)
        r["throttle_reasons"] = self._throttle_reasons()
        r.update(self._field_values())
        for field, (kind, counter) in ECC.items():
            r[field] = get(field, nvml.nvmlDeviceGetTotalEccErrors, kind, counter)
        sbe = get("retired_pages_sbe", nvml.nvmlDeviceGetRetiredPages,
                  pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = get("retired_pages_dbe", nvml.nvmlDeviceGetRetiredPages,
                  pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = get("retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus)
        r["retired_pages_sbe"] = len(sbe) if sbe is not None else None
        r["retired_pages_dbe"] = len(dbe) if dbe is not None else None
        r["retired_pages_pending"] = bool(pending) if pending is not None else None
        rows = get("remapped_rows", nvml.nvmlDeviceGetRemappedRows)
        corr, unc, rpending, failure = rows if rows is not None else (None,) * 4
        r["remapped_rows_correctable"], r["remapped_rows_uncorrectable"] = corr, unc
        r["row_remap_pending"] = bool(rpending) if rpending is not None else None
        r["row_remap_failure"] = bool(failure) if failure is not None else None
        r["pcie_replay_count"] = get("pcie_replay_count", nvml.nvmlDeviceGetPcieReplayCounter)
        r["pcie_link_gen"] = get("pcie_link_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration)
        r["pcie_link_width"] = get("pcie_link_width", nvml.nvmlDeviceGetCurrPcieLinkWidth)
        hist = get("remap_histogram", nvml.nvmlDeviceGetRowRemapperHistogram)
        for level in ("max", "high", "partial", "low", "none"):
            r[f"remap_banks_{level}"] = getattr(hist, level) if hist is not None else None
        for field, counters in NVLINK.items():
            r[field] = self._nvlink_sum(field, counters)
        r["nvlink_links"], r["nvlink_active_mask"] = self._nvlink_states()
        r.update(self._fabric())
        violations = {}
        for name, policy in VIOLATIONS.items():
            v = get(f"violation_{name}", nvml.nvmlDeviceGetViolationStatus, policy)
            violations[name] = int(v.violationTime) if v is not None else None
        r["throttle_power_ns"], r["throttle_thermal_ns"] = violations.get("power"), violations.get("thermal")
        r["mig_enabled"] = None if mig_now is None else mig_now == 1
        r["unsupported"] = sorted(f for g in self.unsupported for f in GROUP_FIELDS.get(g, (g,)) if f in _READING)
        return r, {"mig_mode": mig_now, "mig_pending": int(mig[1]) if mig is not None else None,
                   "violation_ns": violations}

    def _throttle_reasons(self) -> int | None:
        if "throttle_reasons" in self.unsupported:
            return None
        try:
            return int(self._reasons(self.handle))
        except NVMLError as exc:
            deprecated = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            if error_code(exc) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and self._reasons is not deprecated:
                self._reasons = deprecated  # driver older than r535: only the throttle-named entry point exists
                return self._throttle_reasons()
            return self._fault_or_none(exc, "throttle_reasons", self._reasons.__name__)

    def _field_values(self) -> dict:
        wanted = [f for f in FIELD_IDS if f not in self.unsupported]
        out: dict[str, Any] = dict.fromkeys(FIELD_IDS)
        if not wanted:
            return out
        values = self._get("field_values", self.nvml.nvmlDeviceGetFieldValues, [FIELD_IDS[f] for f in wanted])
        if values is None:
            return out
        for field, value in zip(wanted, values):
            code = int(value.nvmlReturn)
            if code == pynvml.NVML_SUCCESS:
                out[field] = field_value(value)
            elif code in FIELD_UNSUPPORTED:
                self.unsupported.add(field)
            elif code in DEVICE_FAULTS:
                raise DeviceFaultError(DEVICE_FAULTS[code], code, "nvmlDeviceGetFieldValues")
            else:
                self.errors[f"{field}:{error_name(code)}"] += 1
        if out["recovery_action"] is not None and not 0 <= out["recovery_action"] <= 7:
            self.errors["recovery_action:out_of_range"] += 1  # an enum value newer than the schema
            out["recovery_action"] = None
        return out

    def _nvlink_states(self) -> tuple[int | None, int | None]:
        """(links the GPU has, bit mask of those active now): a link that trained down since open shows here."""
        if "nvlink_state" in self.unsupported:
            return None, None
        mask = 0
        for link in self.link_ids:
            state = self._get("nvlink_state", self.nvml.nvmlDeviceGetNvLinkState, link)
            if state is None:
                return len(self.link_ids), None  # one link unread: a mask without it would say it is down
            if state == pynvml.NVML_FEATURE_ENABLED:
                mask |= 1 << link
        return len(self.link_ids), mask

    def _fabric(self) -> dict[str, Any]:
        """The GPU's fabric (NVLink domain) as DCGM reports it: nvmlDeviceGetGpuFabricInfoV (r550+, with the health
        mask), else nvmlDeviceGetGpuFabricInfo (r535). State COMPLETED with an error status is a failed training."""
        out: dict[str, Any] = dict.fromkeys(GROUP_FIELDS["fabric"])
        if "fabric" in self.unsupported:
            return out
        info: Any = pynvml.c_nvmlGpuFabricInfo_v2_t()
        try:
            self.nvml.nvmlDeviceGetGpuFabricInfoV(self.handle, ctypes.byref(info))
        except NVMLError as exc:
            if error_code(exc) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                return self._fault_or_none(exc, "fabric", "nvmlDeviceGetGpuFabricInfoV") or out
            info = pynvml.c_nvmlGpuFabricInfo_t()
            if self._get("fabric", self.nvml.nvmlDeviceGetGpuFabricInfo, ctypes.byref(info)) is None:
                return out
        state, status = int(info.state), int(info.status)
        if state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            out["fabric_status"] = FABRIC_SUCCESS if status == pynvml.NVML_SUCCESS else FABRIC_FAILURE
        else:
            out["fabric_status"] = state if state < pynvml.NVML_GPU_FABRIC_STATE_COMPLETED else 5  # unrecognized
        if state != pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            out["fabric_clique_id"] = int(info.cliqueId)
            raw = bytes(info.clusterUuid)
            out["fabric_cluster_uuid"] = str(uuid.UUID(bytes=raw)) if any(raw) else None
            out["fabric_health_mask"] = int(info.healthMask) if hasattr(info, "healthMask") else None  # r535: none
        return out

    def _nvlink_sum(self, field: str, counters: tuple[int, ...]) -> int | None:
        total = 0
        for link in self.links:
            for counter in counters:
                value = self._get(field, self.nvml.nvmlDeviceGetNvLinkErrorCounter, link, counter)
                if value is None:
                    return None  # unsupported or a transient miss: a partial sum would be a made-up number
                total += value
        return None if field in self.unsupported else total

    def _get(self, group: str, fn: Callable, *args) -> Any:
        """fn(handle, *args), or None when the group is unsupported or the call failed transiently."""
        if group in self.unsupported:
            return None
        self.call = fn.__name__
        try:
            return fn(self.handle, *args)
        except NVMLError as exc:
            return self._fault_or_none(exc, group, fn.__name__)

    def _fault_checked(self, group: str, fn: Callable, *args) -> Any:
        self.call = fn.__name__
        try:
            return fn(*args)
        except NVMLError as exc:
            code = error_code(exc)
            if code in HOST_FAULTS:
                raise NvmlUnavailableError(f"GPU {self.index}: {fn.__name__}: {error_name(code)}") from exc
            raise DeviceFaultError(DEVICE_FAULTS.get(code, "unreadable"), code, fn.__name__) from exc

    def _fault_or_none(self, exc: NVMLError, group: str, call: str = "") -> None:
        code = error_code(exc)
        if code in UNSUPPORTED_CODES:
            self.unsupported.add(group)
        elif code in DEVICE_FAULTS:
            raise DeviceFaultError(DEVICE_FAULTS[code], code, call or group) from exc
        elif code in HOST_FAULTS:
            raise NvmlUnavailableError(f"GPU {self.index}: {group}: {error_name(code)}") from exc
        elif group != "nvlink_probe":
            self.errors[f"{group}:{error_name(code)}"] += 1
        return None

    @staticmethod
    def _num(value: Any) -> float | None:
        return float(value) if value is not None else None
