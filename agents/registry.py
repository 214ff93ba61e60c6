"""The collector registry: stable names -> how each host collector is built, how often it runs, what it publishes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from pydantic import BaseModel
from pynvml import NVMLError

from agents.dcgm import DcgmExporterCollector, DcgmScrape
from agents.infiniband import InfinibandCollector
from agents.kernel_log import FileSource, JournaldSource, KernelLogCollector, KmsgSource
from agents.nccl import InspectorCollector
from agents.nvml import DeviceFault, Nvml, NvmlCollector, NvmlPoll, NvmlXidCollector, load_pynvml, normalize_pci_bus_id
from agents.settings import AgentSettings
from schemas.events import HostEvent, NcclStep, NcclTiming, XidEvent, group_timings
from schemas.network import NetSample
from schemas.telemetry import HostSample
from schemas.topics import HOST_EVENTS, NCCL, NET, SAMPLES, XID, Topic

log = logging.getLogger(__name__)

# How a DeviceFault travels on the XID topic, so the fault-bin stage bins it like the kernel's own report:
# a lost GPU is Xid 79 (fallen off the bus); a GPU that needs a reset is an Xid 154 whose recovery action is
# GPU_RESET (1); an UNKNOWN / unreadable device is an Xid 154 without an action, which the catalog sends to a person.
FAULT_XID: dict[str, tuple[int, int | None]] = {"gpu_lost": (79, None), "reset_required": (154, 1),
                                               "unknown_error": (154, None), "unreadable": (154, None)}


class Collector(Protocol):
    name: str

    def is_supported(self) -> bool: ...
    def sample(self) -> Any: ...
    def close(self) -> None: ...


@dataclass
class BuildContext:
    """What collectors share: settings, the NVML library (pynvml or a fake), and the live NVML XID collector."""

    settings: AgentSettings
    nvml: Nvml | None = None
    xid: NvmlXidCollector | None = None
    _gpu_maps: tuple[dict[str, int], dict[str, str]] | None = field(default=None, repr=False)

    @property
    def labels(self) -> dict[str, str]:
        s = self.settings
        return {"host": s.agent_host, "rack": s.agent_rack, "cluster": s.agent_cluster}

    def library(self) -> Nvml:
        return self.nvml if self.nvml is not None else load_pynvml()

    def gpu_maps(self) -> tuple[dict[str, int], dict[str, str]]:
        """(PCI id -> GPU index, PCI id -> UUID) for the kernel-log parser; empty where NVML is unusable."""
        if self._gpu_maps is None:
            nvml, index, uuid = self.library(), {}, {}
            try:
                nvml.nvmlInit()
            except NVMLError:
                return {}, {}
            try:
                for i in range(nvml.nvmlDeviceGetCount()):
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    pci = normalize_pci_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
                    raw = nvml.nvmlDeviceGetUUID(handle)
                    index[pci], uuid[pci] = i, raw.decode() if isinstance(raw, bytes) else raw
            except NVMLError as exc:
                log.warning("GPU map for the kernel log incomplete: %s", exc)
            finally:
                nvml.nvmlShutdown()
            self._gpu_maps = index, uuid
        return self._gpu_maps


class Unconfigured:
    """A collector that needs a setting nobody gave: unsupported, with the reason naming the setting."""

    def __init__(self, name: str, reason: str):
        self.name, self.unsupported_reason = name, reason

    def is_supported(self) -> bool:
        return False

    def sample(self) -> list:
        return []

    def close(self) -> None:
        pass


def _nvml(ctx: BuildContext) -> Collector:
    s = ctx.settings
    return NvmlCollector(ctx.library(), **ctx.labels, job=s.agent_job,
                         last_xid=lambda uuid: ctx.xid.last_xid.get(uuid) if ctx.xid is not None else None)


def _nvml_xid(ctx: BuildContext) -> Collector:
    ctx.xid = NvmlXidCollector(ctx.library(), **ctx.labels, timeout_ms=int(ctx.settings.agent_event_poll_s * 1000))
    return ctx.xid


def _dcgm(ctx: BuildContext) -> Collector:
    return DcgmExporterCollector(url=ctx.settings.agent_dcgm_url, **ctx.labels)


def _kernel_log(ctx: BuildContext) -> Collector:
    choice = ctx.settings.agent_kernel_log
    source = (None if choice == "auto" else KmsgSource() if choice == "kmsg" else
              JournaldSource() if choice == "journald" else FileSource(choice))
    index, uuid = ctx.gpu_maps()
    return KernelLogCollector(source, **ctx.labels, gpu_index_by_pci=index, uuid_by_pci=uuid,
                              poll_interval_s=ctx.settings.agent_event_poll_s)


def _nccl_inspector(ctx: BuildContext) -> Collector:
    dump_dir = ctx.settings.agent_nccl_dump_dir
    if dump_dir is None:
        return Unconfigured("nccl_inspector", "FLEETPULSE_AGENT_NCCL_DUMP_DIR is not set")
    return InspectorCollector(dump_dir, job=ctx.settings.agent_job)


def _infiniband(ctx: BuildContext) -> Collector:
    return InfinibandCollector(str(ctx.settings.agent_infiniband_root), **ctx.labels, job=ctx.settings.agent_job)


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    build: Callable[[BuildContext], Collector]
    continuous: bool  # an event source followed every agent_event_poll_s, not a sample every agent_interval_s
    description: str
    gpu_samples: bool = False  # publishes HostSamples: the records by which the pipeline hears the host is alive


# Build order matters: nvml_xid before nvml, so the sample's last_xid can read the XID collector.
REGISTRY: dict[str, CollectorSpec] = {spec.name: spec for spec in (
    CollectorSpec("nvml_xid", _nvml_xid, True, "XID events through NVML (nvmlEventTypeXidCriticalError)"),
    CollectorSpec("nvml", _nvml, False, "every GPU's telemetry through NVML; lost GPUs become fault events", True),
    CollectorSpec("dcgm", _dcgm, False, "a local dcgm-exporter's metrics, as a HostSample with source dcgm", True),
    CollectorSpec("kernel_log", _kernel_log, True, "XID/SXid lines, and NIC, NVMe, filesystem and machine-check "
                  "lines, from /dev/kmsg, journald or a log file"),
    CollectorSpec("nccl_inspector", _nccl_inspector, True, "NCCL Inspector plugin dump files"),
    CollectorSpec("infiniband", _infiniband, False, "every InfiniBand/RoCE port's state, rate and error counters "
                  "from sysfs, as a NetSample"),
)}


def chosen_specs(settings: AgentSettings) -> list[CollectorSpec]:
    return [spec for name, spec in REGISTRY.items() if name in settings.agent_collectors]


def unsupported_reason(collector: Collector) -> str:
    return getattr(collector, "unsupported_reason", None) or "not available on this host"


def fault_event(fault: DeviceFault, sample: HostSample) -> XidEvent:
    """A DeviceFault as an XidEvent on the XID topic (see FAULT_XID), labelled like the sample that saw it."""
    code, action = FAULT_XID[fault.kind]
    return XidEvent(host=sample.host, rack=sample.rack, cluster=sample.cluster, ts=fault.ts, kind="xid", code=code,
                    pci_bus_id=fault.pci_bus_id, gpu_index=fault.gpu_index, gpu_uuid=fault.uuid,
                    recovery_action=action, source="nvml",
                    message=f"NVML {fault.kind}: {fault.call} returned {fault.error_name} ({fault.nvml_error})")


def messages(result: Any, job: str | None = None) -> list[tuple[Topic, BaseModel]]:
    """What one collector poll publishes: (topic, message) pairs, in order."""
    if isinstance(result, NvmlPoll):
        return [(SAMPLES, result.sample), *((XID, fault_event(f, result.sample)) for f in result.faults)]
    if isinstance(result, DcgmScrape):
        sample = result.sample if job is None else result.sample.model_copy(update={"job": job})
        return [(SAMPLES, sample)]
    if isinstance(result, NetSample):
        return [(NET, result)]
    topics = {XidEvent: XID, HostSample: SAMPLES, HostEvent: HOST_EVENTS}
    result = list(result or [])
    timings = [m for m in result if isinstance(m, NcclTiming)]
    steps = [(NCCL, NcclStep.model_validate(s)) for s in group_timings(timings)]  # a host's ranks: one record each
    return [(topics[type(m)], m) for m in result if not isinstance(m, NcclTiming)] + steps
