"""NvmlXidCollector: XID errors as NVML delivers them (nvmlEventTypeXidCriticalError), polled without blocking."""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from typing import Any, Callable

import pynvml
from pynvml import NVMLError

from agents.nvml.lib import (
    HOST_FAULTS, Nvml, NvmlUnavailableError, error_code, error_name, load_pynvml, normalize_pci_bus_id, text,
)
from schemas.events import XidEvent

UNATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId when the event belongs to no MIG instance


def _handle_key(handle: Any) -> int:
    """The device pointer's address: how an event's `device` is matched to a GPU even after the GPU is lost."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlXidCollector:
    """A second XID channel next to the kernel log: registers every GPU for XID events, drains them on `sample()`.

    `sample()` waits at most `timeout_ms` for the first event, then drains what is queued without waiting (up to
    `max_events`). `last_xid` maps GPU UUID -> latest code, for NvmlCollector's `last_xid` field.
    """

    name = "nvml_xid"

    def __init__(self, nvml: Nvml | None = None, *, host: str, rack: str = "", cluster: str = "",
                 clock: Callable[[], float] = time.time, timeout_ms: int = 10, max_events: int = 1000):
        self.nvml = nvml if nvml is not None else load_pynvml()
        self.host, self.rack, self.cluster, self.clock = host, rack, cluster, clock
        self.timeout_ms, self.max_events = timeout_ms, max_events
        self.last_xid: dict[str, int] = {}
        self.unregistered: dict[int, str] = {}  # GPU index -> why it gets no XID events
        self.errors: Counter[str] = Counter()
        self.unsupported_reason: str | None = None
        self._gpus: dict[int, tuple[int, str | None, str | None]] = {}  # handle key -> (index, uuid, pci)
        self._event_set: Any = None
        self._started = self._initialized = False

    def is_supported(self) -> bool:
        if not self._started:
            self._start()
        return self.unsupported_reason is None

    def _start(self) -> None:
        self._started = True
        nvml, xid = self.nvml, pynvml.nvmlEventTypeXidCriticalError
        try:
            nvml.nvmlInit()
            self._initialized = True
            count = nvml.nvmlDeviceGetCount()
            self._event_set = nvml.nvmlEventSetCreate()
        except NVMLError as exc:
            self.unsupported_reason = f"init: {error_name(error_code(exc))}"
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
                pci = normalize_pci_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
                if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid:
                    self.unregistered[index] = "XID events not supported"
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, xid, self._event_set)
            except NVMLError as exc:
                self.unregistered[index] = error_name(error_code(exc))
                continue
            self._gpus[_handle_key(handle)] = (index, uuid, pci)
        if not self._gpus:
            self.unsupported_reason = "no GPU accepts XID event registration"

    def sample(self) -> list[XidEvent]:
        if not self.is_supported():
            raise NvmlUnavailableError(f"NVML XID events unsupported on {self.host}: {self.unsupported_reason}")
        events: list[XidEvent] = []
        timeout = self.timeout_ms
        while len(events) < self.max_events:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self._event_set, timeout)
            except NVMLError as exc:
                code = error_code(exc)
                if code in HOST_FAULTS:
                    raise NvmlUnavailableError(f"nvmlEventSetWait_v2: {error_name(code)}") from exc
                if code != pynvml.NVML_ERROR_TIMEOUT:
                    self.errors[error_name(code)] += 1  # e.g. GPU_IS_LOST: NvmlCollector reports the GPU itself
                break
            timeout = 0
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                events.append(self._event(data))
        return events

    def _event(self, data: Any) -> XidEvent:
        index, uuid, pci = self._gpus.get(_handle_key(data.device), (None, None, None))
        code = int(data.eventData)
        if uuid is not None:
            self.last_xid[uuid] = code
        instance = int(data.gpuInstanceId)
        return XidEvent(host=self.host, rack=self.rack, cluster=self.cluster, ts=self.clock(), kind="xid", code=code,
                        pci_bus_id=pci, gpu_index=index, gpu_uuid=uuid,
                        gpu_instance=None if instance == UNATTRIBUTED else instance,
                        message=f"NVML XID critical error event: Xid {code}", source="nvml")

    def close(self) -> None:
        try:
            if self._event_set is not None:
                self.nvml.nvmlEventSetFree(self._event_set)
            if self._initialized:
                self.nvml.nvmlShutdown()
        except NVMLError:
            pass
        self._event_set, self._gpus = None, {}
        self._started = self._initialized = False
