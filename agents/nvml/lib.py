"""The NVML seam: the `Nvml` surface collectors call, the real pynvml behind it, and what each NVML error means."""

from __future__ import annotations

from typing import Any, Literal, Protocol, Sequence

import pynvml
from pynvml import NVMLError

from core.errors import FleetpulseError
from schemas.pci import normalize_pci

FaultKind = Literal["gpu_lost", "reset_required", "unknown_error", "unreadable"]

# A field the device cannot report: a value (None + listed in `unsupported`), never a crash.
UNSUPPORTED_CODES = frozenset({
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # the installed driver predates the function
})
# The device itself is gone or wedged: it leaves the sample and becomes a health event.
DEVICE_FAULTS: dict[int, FaultKind] = {
    pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required",
    pynvml.NVML_ERROR_UNKNOWN: "unknown_error",
}
# The whole library is unusable on this host (no driver, driver unloaded, NVML/kernel-module mismatch).
HOST_FAULTS = frozenset({
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
})


class NvmlUnavailableError(FleetpulseError):
    """NVML cannot be used on this host right now (no library, no driver, driver reloading)."""

    retryable = True


def error_code(exc: NVMLError) -> int:
    return int(getattr(exc, "value", pynvml.NVML_ERROR_UNKNOWN))


def error_name(code: int) -> str:
    """pynvml's class name for an NVML return code, e.g. 15 -> 'NVMLError_GpuIsLost'."""
    try:
        return pynvml.nvmlExceptionClass(code).__name__
    except ValueError:
        return f"NVMLError({code})"


def text(value: str | bytes) -> str:
    """NVML strings arrive as str from nvidia-ml-py >= 11 and as bytes from older bindings."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """NVML's or DCGM's bus id ('00000000:1A:00.0', b'...', 'PCI:0000:2b:00') in the wire's one spelling,
    schemas.pci.normalize_pci's ('0000:1a:00.0'); an id that does not parse stays as read, in lower case."""
    raw = text(bus_id).strip().lower().removeprefix("pci:")
    try:
        return normalize_pci(raw)
    except (ValueError, IndexError):
        return raw


def field_value(value: Any) -> float | int:
    """The number inside a c_nvmlFieldValue_t, read from the union member its valueType names."""
    member = _VALUE_MEMBERS.get(int(value.valueType), "ullVal")
    return getattr(value.value, member)


_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class Nvml(Protocol):
    """The pynvml functions fleetpulse calls, with pynvml's names and signatures.

    The `pynvml` module itself satisfies this protocol; so does `agents.nvml.fake.FakeNvml`. Errors are raised as
    `pynvml.NVMLError` subclasses carrying the real NVML return code in `.value`.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[int]) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetRowRemapperHistogram(self, device: Any) -> Any: ...
    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int: ...
    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...


def load_pynvml() -> Nvml:
    """The real library: the pynvml module (nvidia-ml-py). Importing never needs libnvidia-ml; nvmlInit does."""
    return pynvml  # type: ignore[return-value]
