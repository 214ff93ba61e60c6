"""The kernel-log collector: follows one source (kmsg, journald or a file) and yields XidEvents for the GPUs' XID/SXid
lines and HostEvents for the host around them (mlx5 NIC, NVMe and block I/O, ext4/XFS, machine checks and EDAC)."""

from __future__ import annotations

import asyncio
import time
import warnings
from typing import AsyncIterator, Callable, Mapping, Protocol

from schemas.pci import normalize_pci
from agents.kernel_log.parser import KernelLogParser
from agents.kernel_log.sources import FileSource, JournaldSource, KmsgSource, Record
from schemas.events import HostEvent, XidEvent

FALLBACK_FILES = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")


class Source(Protocol):
    kind: str
    unsupported_reason: str | None

    def is_supported(self) -> bool: ...
    def read(self) -> list[Record]: ...
    def close(self) -> None: ...


class StaticSource:
    """Records handed in by the caller (tests, replays): each `read` returns what was added since the last one."""

    def __init__(self, records: list[Record | str] = (), kind: str = "file"):
        self.kind = kind
        self.unsupported_reason: str | None = None
        self._records = [r if isinstance(r, Record) else Record(r) for r in records]

    def add(self, *records: Record | str) -> None:
        self._records.extend(r if isinstance(r, Record) else Record(r) for r in records)

    def is_supported(self) -> bool:
        return True

    def read(self) -> list[Record]:
        out, self._records = self._records, []
        return out

    def close(self) -> None:
        self._records = []


def default_sources() -> list[Source]:
    """Preference order: the kernel's own ring, then journald, then the syslog files."""
    return [KmsgSource(), JournaldSource(), *(FileSource(p) for p in FALLBACK_FILES)]


def nvml_gpu_map() -> tuple[dict[str, int], dict[str, str]]:
    """(PCI id -> GPU index, PCI id -> UUID) from NVML; two empty maps where NVML or its driver is absent."""
    try:
        with warnings.catch_warnings():  # the deprecated `pynvml` shim, where installed, warns on import
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: the parser still works, without GPU indices
        return {}, {}
    index_by_pci: dict[str, int] = {}
    uuid_by_pci: dict[str, str] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
            pci = normalize_pci(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            index_by_pci[pci], uuid_by_pci[pci] = i, uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()
    return index_by_pci, uuid_by_pci


class KernelLogCollector:
    """Collector lifecycle (name, is_supported, sample, close) around one kernel-log source and the parser.

    With no source given, the first supported of `default_sources()` is followed; when none is, the collector is
    unsupported (the reasons are in `unsupported_reason`) and `sample()` returns nothing.
    """

    name = "kernel_log"

    def __init__(self, source: Source | None = None, *, host: str, rack: str = "", cluster: str = "",
                 gpu_index_by_pci: Mapping[str, int] | None = None, uuid_by_pci: Mapping[str, str] | None = None,
                 dedup_window_s: float = 10.0, clock: Callable[[], float] = time.time,
                 poll_interval_s: float = 0.5):
        self._candidates = [source] if source is not None else default_sources()
        self.source: Source | None = None
        self.unsupported_reason: str | None = None
        self.poll_interval_s = poll_interval_s
        self.parser = KernelLogParser(host=host, rack=rack, cluster=cluster, gpu_index_by_pci=gpu_index_by_pci,
                                      uuid_by_pci=uuid_by_pci, dedup_window_s=dedup_window_s, clock=clock)
        self._closed = False

    def is_supported(self) -> bool:
        if self.source is not None:
            return True
        reasons = []
        for candidate in self._candidates:
            if candidate.is_supported():
                self.source = candidate
                self.parser.source = candidate.kind
                self.parser.boot_time = getattr(candidate, "boot_time", None)
                self.unsupported_reason = None
                return True
            reasons.append(candidate.unsupported_reason or f"{candidate.kind} unsupported")
        self.unsupported_reason = "; ".join(reasons)
        return False

    def sample(self) -> list[XidEvent | HostEvent]:
        """Everything new in the source since the last call, in line order, without blocking."""
        if self._closed or not self.is_supported():
            return []
        events: list[XidEvent | HostEvent] = []
        for record in self.source.read():
            for line in record.text.split("\n"):
                events.extend(d.event for d in self.parser.feed(line, ts=record.ts))
        return events

    async def __aiter__(self) -> AsyncIterator[XidEvent | HostEvent]:
        """Follow the source until `close()`; ends at once when no source is supported."""
        if not self.is_supported():
            return
        while not self._closed:
            events = self.sample()
            for event in events:
                yield event
            if not events:
                await asyncio.sleep(self.poll_interval_s)

    def close(self) -> None:
        self._closed = True
        for candidate in self._candidates:
            candidate.close()
