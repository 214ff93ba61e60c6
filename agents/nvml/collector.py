"""NvmlCollector: one HostSample per poll with every GPU of the host; a lost GPU leaves it and becomes a fault."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from pydantic import ValidationError
from pynvml import NVMLError

from agents.nvml.device import DeviceFaultError, NvmlDevice
from agents.nvml.lib import FaultKind, Nvml, NvmlUnavailableError, error_code, error_name, load_pynvml, text
from schemas.telemetry import GpuReading, HostSample


def validated_reading(reading: dict, invalid: Counter[str]) -> GpuReading:
    """A GpuReading; a value the schema refuses (a glitch of the source) becomes None and is counted, not raised."""
    while True:
        try:
            return GpuReading.model_validate(reading)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            nullable = {f for f in bad if f in reading and f != "unsupported"
                        and not GpuReading.model_fields[f].is_required() and reading[f] is not None}
            if not nullable:
                raise
            for f in nullable:
                invalid[f] += 1
                reading[f] = None


@dataclass(frozen=True)
class DeviceFault:
    """A GPU NVML can no longer read. `kind` doubles as the FaultEvent code (gpu_lost, reset_required, ...)."""

    kind: FaultKind
    gpu_index: int
    uuid: str | None
    pci_bus_id: str | None
    nvml_error: int
    error_name: str
    call: str  # the NVML function (or read group) that answered with the error
    ts: float


@dataclass
class NvmlPoll:
    """What one poll produced: the sample, faults first seen in this poll, and per-GPU extras (keyed by UUID)."""

    sample: HostSample
    faults: list[DeviceFault] = field(default_factory=list)
    extras: dict[str, dict] = field(default_factory=dict)


class NvmlCollector:
    """Reads every GPU through an injected `Nvml` (pynvml by default).

    Identity, temperature limits and active NVLink links are read when a GPU is opened (at start, and again once a
    faulted GPU answers). Faults are edge-triggered: `NvmlPoll.faults` carries a fault the first poll it is seen
    (or when its kind changes); `active_faults` holds every GPU currently out. `last_xid`, if given, maps a GPU UUID
    to its latest XID code (e.g. `NvmlXidCollector.last_xid.get`).
    """

    name = "nvml"

    def __init__(self, nvml: Nvml | None = None, *, host: str, rack: str = "", cluster: str = "",
                 job: str | None = None, clock: Callable[[], float] = time.time,
                 last_xid: Callable[[str], int | None] | None = None):
        self.nvml = nvml if nvml is not None else load_pynvml()
        self.host, self.rack, self.cluster, self.job = host, rack, cluster, job
        self.clock, self.last_xid = clock, last_xid
        self.seq = 0
        self.driver_version: str | None = None
        self.devices: list[NvmlDevice] = []
        self.active_faults: dict[int, DeviceFault] = {}
        self.invalid: Counter[str] = Counter()  # values NVML returned that the schema refuses, by field
        self.unsupported_reason: str | None = None
        self._started = self._initialized = False
        self._pending: list[DeviceFault] = []
        self._reading: NvmlDevice | None = None  # the GPU a poll is reading now

    def is_supported(self) -> bool:
        """True when NVML initialises and sees at least one GPU; the reason otherwise is in `unsupported_reason`."""
        if not self._started:
            self._start()
        return self.unsupported_reason is None

    def _start(self) -> None:
        self._started = True
        try:
            self.nvml.nvmlInit()
        except NVMLError as exc:
            self.unsupported_reason = f"nvmlInit: {error_name(error_code(exc))}"
            return
        self._initialized = True
        try:
            self.driver_version = text(self.nvml.nvmlSystemGetDriverVersion())
            count = self.nvml.nvmlDeviceGetCount()
        except NVMLError as exc:
            self.unsupported_reason = f"enumerate: {error_name(error_code(exc))}"
            return
        if count == 0:
            self.unsupported_reason = "no GPUs"
            return
        self.devices = [NvmlDevice(self.nvml, i) for i in range(count)]
        ts = self.clock()
        for device in self.devices:
            try:
                device.open()
            except DeviceFaultError as exc:
                self._record(device, exc, ts, self._pending)

    def sample(self) -> NvmlPoll:
        """Poll every GPU once. Raises NvmlUnavailableError when NVML is unusable on this host."""
        if not self.is_supported():
            raise NvmlUnavailableError(f"NVML unsupported on {self.host}: {self.unsupported_reason}")
        ts = self.clock()
        faults, self._pending = self._pending, []
        gpus: list[GpuReading] = []
        extras: dict[str, dict] = {}
        for device in self.devices:
            self._reading = device
            try:
                if device.handle is None:
                    device.open()
                reading, extra = device.read()
            except DeviceFaultError as exc:
                self._record(device, exc, ts, faults)
                continue
            self.active_faults.pop(device.index, None)
            if self.last_xid is not None and device.uuid is not None:
                reading["last_xid"] = self.last_xid(device.uuid)
            gpus.append(validated_reading(reading, self.invalid))
            extras[device.uuid] = extra
        self._reading = None
        sample = HostSample(host=self.host, rack=self.rack, cluster=self.cluster, job=self.job, ts=ts, seq=self.seq,
                            source="nvml", driver_version=self.driver_version, gpus=gpus)
        self.seq += 1
        return NvmlPoll(sample, faults, extras)

    def doing(self) -> str | None:
        """Where a poll is now, e.g. 'GPU 3: nvmlDeviceGetRemappedRows' (read from another thread: a poll that
        hangs)."""
        device = self._reading
        return None if device is None else f"GPU {device.index}: {device.call or 'opening'}"

    def _record(self, device: NvmlDevice, exc: DeviceFaultError, ts: float, out: list[DeviceFault]) -> None:
        device.handle = None  # reopen next poll: a reset GPU comes back with fresh identity and limits
        fault = DeviceFault(exc.kind, device.index, device.uuid, device.pci_bus_id, exc.code, error_name(exc.code),
                            exc.call, ts)
        previous = self.active_faults.get(device.index)
        if previous is None or previous.kind != fault.kind:
            out.append(fault)
            self.active_faults[device.index] = fault

    @property
    def errors(self) -> Counter[str]:
        """Transient NVML errors by 'gpu<i>:<group>:<NVMLError_Name>' since start."""
        total: Counter[str] = Counter()
        for device in self.devices:
            total.update({f"gpu{device.index}:{k}": v for k, v in device.errors.items()})
        return total

    def close(self) -> None:
        if self._initialized:
            try:
                self.nvml.nvmlShutdown()
            except NVMLError:
                pass
        self._started = self._initialized = False
        self.devices, self.unsupported_reason = [], None
