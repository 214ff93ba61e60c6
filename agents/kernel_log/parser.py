"""Stateful kernel-log reading: XidEvents with GPU identity, the Xid-less 'fallen off the bus' text, HostEvents for
the host around the GPUs (host_lines.py), and repeat dedup for both."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Mapping

from agents.kernel_log.host_lines import ParsedHost, parse_host_line
from agents.kernel_log.lines import PCI, ParsedXid, normalize_pci, parse_line, parse_prefix, parse_sxid_followup
from core.errors import ConfigError
from schemas.events import HostEvent, XidEvent
from schemas.limits import TEXT_MAX

_UUID = re.compile(rf"NVRM: GPU at (?:PCI:)?(?P<pci>{PCI})(?:\.(?P<fn>[0-7]))?: "
                   r"(?P<uuid>GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})")
# 'NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.' and 'NVRM: GPU at 0000:01:00.0 has fallen off the bus.'
_FELL = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{PCI})(?:\.(?P<fn>[0-7]))?:? (?:GPU )?has fallen off the bus")
# 'NVRM: The NVIDIA GPU 0000:b3:00.0' / '(PCI ID: 10de:26b5) installed in this system has' / 'fallen off the bus ...'
_FELL_START = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{PCI})(?:\.(?P<fn>[0-7]))?")
FELL_OFF_CODE = 79
FELL_OFF_MESSAGE = "GPU has fallen off the bus (from the NVRM fall-off text; no Xid line)"
PENDING_LINES = 4  # a multi-line NVRM message that has not said 'fallen off the bus' by then is something else


@dataclass(slots=True)
class Detection:
    """One emitted event with everything its line said (for diagnostics and the CLI)."""

    event: XidEvent | HostEvent
    parsed: ParsedXid | ParsedHost
    line_no: int | None = None


class KernelLogParser:
    """Feed kernel-log lines in order; get XidEvents for new XID/SXid reports and HostEvents for new host lines (NIC,
    storage, filesystem, machine check: host_lines.py), in line order. An XID line is only ever an XidEvent.

    PCI ids map to GPU index through the injected mapping (NVML's, where available) and to GPU UUIDs through the
    injected mapping plus 'NVRM: GPU at PCI:...: GPU-<uuid>' lines seen on the way. A repeat of the same report
    (kind, code, PCI id, MIG instance, message) within `dedup_window_s` of its last emission is counted in
    `repeats`, not emitted; Xid 79 ignores the message, so the fall-off text after an Xid 79 is a repeat too. A host
    line repeats another when its subsystem, code, device and message are the same, within the same window.
    """

    def __init__(self, *, host: str, rack: str = "", cluster: str = "",
                 gpu_index_by_pci: Mapping[str, int] | None = None, uuid_by_pci: Mapping[str, str] | None = None,
                 dedup_window_s: float = 10.0, clock: Callable[[], float] = time.time,
                 boot_time: float | None = None, source: str = "file"):
        if not host:
            raise ConfigError("the kernel-log parser needs the host label")
        self.labels = {"host": host, "rack": rack, "cluster": cluster}
        try:
            self.gpu_index_by_pci = {normalize_pci(k): v for k, v in (gpu_index_by_pci or {}).items()}
            self.uuid_by_pci = {normalize_pci(k): v for k, v in (uuid_by_pci or {}).items()}
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"GPU map keys must be PCI bus ids like 0000:2b:00.0: {exc}") from exc
        self.dedup_window_s = dedup_window_s
        self.clock = clock
        self.boot_time = boot_time
        self.source = source
        self.repeats: Counter[tuple] = Counter()
        self._prune_at = 4096
        self.stats: Counter[str] = Counter()
        self._last_emit: dict[tuple, float] = {}
        self._pending: tuple[str, int, str, list[str]] | None = None  # pci, lines left, start prefix, lines
        self._sxid_seen: dict[tuple, float] = {}  # (switch PCI id, code) -> time of the report's latest line

    def feed(self, line: str, *, ts: float | None = None, source: str | None = None,
             line_no: int | None = None) -> list[Detection]:
        """One line (no trailing newline); `ts` is the record's own time where the transport has one."""
        self.stats["lines"] += 1
        parsed = parse_line(line)
        if parsed is None and "SXid" in line:
            parsed = self._orphan_sxid(line, ts)
            if parsed is None:
                return []
        if parsed is None:
            found = self._companion(line)
            if found is None:
                return self._host(line, ts, source or self.source, line_no)
            parsed, line = found
        if parsed.kind == "sxid":
            now = self._sxid_seen[(parsed.pci_bus_id, parsed.code)] = self._time(parsed, ts)
            if len(self._sxid_seen) > 4096:
                self._sxid_seen = {k: t for k, t in self._sxid_seen.items() if abs(now - t) < self.dedup_window_s}
        self.stats["matched"] += 1
        return self._emit(parsed, line, ts, source or self.source, line_no)

    def feed_lines(self, lines, **kwargs) -> list[Detection]:
        return [d for i, line in enumerate(lines, 1) for d in self.feed(line, line_no=i, **kwargs)]

    def _orphan_sxid(self, line: str, ts: float | None) -> ParsedXid | None:
        """An SXid report's Severity or Data line is one event only when no line of the same report (switch PCI id
        and code) came within `dedup_window_s` before it: its first line was lost, and the report must not be."""
        parsed = parse_sxid_followup(line)
        if parsed is None:
            return None
        seen = self._sxid_seen.get((parsed.pci_bus_id, parsed.code))
        if seen is not None and abs(self._time(parsed, ts) - seen) < self.dedup_window_s:
            return None
        self.stats["sxid_without_first_line"] += 1
        return parsed

    def _companion(self, line: str) -> tuple[ParsedXid, str] | None:
        """UUID lines teach PCI -> UUID; the fall-off texts become a 79-equivalent (with the text it came from)."""
        if self._pending is not None:
            pci, left, prefix, seen = self._pending
            seen.append(line)
            if "fallen off the bus" in line:
                self._pending = None
                return self._fell_off(pci, prefix), "\n".join(seen)
            self._pending = (pci, left - 1, prefix, seen) if left > 1 else None
        if "NVRM: " not in line:
            return None
        if "NVRM: GPU at " in line and (m := _UUID.search(line)):
            self.uuid_by_pci[normalize_pci(f"{m.group('pci')}.{m.group('fn') or 0}")] = m.group("uuid")
            self.stats["uuids_learned"] += 1
            return None
        if "fallen off the bus" in line and (m := _FELL.search(line)):
            return self._fell_off(f"{m.group('pci')}.{m.group('fn') or 0}", line[:m.start()]), line
        if "NVRM: The NVIDIA GPU " in line and (m := _FELL_START.search(line)):
            pci = f"{m.group('pci')}.{m.group('fn') or 0}"
            if "fallen off the bus" in line[m.end():]:
                return self._fell_off(pci, line[:m.start()]), line
            self._pending = (pci, PENDING_LINES, line[:m.start()], [line])
        return None

    def _fell_off(self, pci: str, prefix: str) -> ParsedXid:
        parsed = ParsedXid("xid", FELL_OFF_CODE, normalize_pci(pci), FELL_OFF_MESSAGE, fell_off_text=True)
        parse_prefix(prefix, parsed)
        self.stats["fell_off_text"] += 1
        return parsed

    def _time(self, parsed: ParsedXid | ParsedHost, ts: float | None) -> float:
        if ts is None and parsed.wall_ts is not None:
            ts = parsed.wall_ts
        if ts is None and parsed.syslog_stamp is not None:
            ts = self._syslog_time(parsed.syslog_stamp)
        if ts is None and parsed.uptime_s is not None and self.boot_time is not None:
            ts = self.boot_time + parsed.uptime_s
        return ts if ts is not None and ts > 0 else self.clock()

    def _syslog_time(self, stamp: str) -> float | None:
        """'May 18 19:02:39' (local time, no year): this year, or last year if that would be in the future."""
        now = self.clock()
        year = datetime.fromtimestamp(now).year
        try:
            ts = datetime.strptime(f"{year} {stamp}", "%Y %b %d %H:%M:%S").timestamp()
            if ts > now + 86400:
                ts = datetime.strptime(f"{year - 1} {stamp}", "%Y %b %d %H:%M:%S").timestamp()
        except ValueError:  # Feb 29 outside a leap year
            return None
        return ts

    def _repeat(self, key: tuple, ts: float) -> bool:
        """True, and counted in `repeats`, when `key` was last emitted within `dedup_window_s` of `ts`."""
        last = self._last_emit.get(key)
        if last is not None and abs(ts - last) < self.dedup_window_s:
            self.repeats[key] += 1
            self.stats["repeats"] += 1
            return True
        self._last_emit[key] = ts
        if len(self._last_emit) > self._prune_at:
            self._last_emit = {k: t for k, t in self._last_emit.items() if abs(ts - t) < self.dedup_window_s}
            # Prune again only once the table has doubled: a storm of distinct lines stays linear, not quadratic.
            self._prune_at = max(4096, 2 * len(self._last_emit))
        return False

    def _host(self, line: str, ts: float | None, source: str, line_no: int | None) -> list[Detection]:
        parsed = parse_host_line(line)
        if parsed is None:
            return []
        self.stats["host_matched"] += 1
        ts = self._time(parsed, ts)
        if self._repeat(("host", parsed.subsystem, parsed.code, parsed.device, parsed.message), ts):
            return []
        event = HostEvent(**self.labels, ts=ts, subsystem=parsed.subsystem, code=parsed.code, device=parsed.device,
                          severity=parsed.severity, message=parsed.message, raw_line=line[:TEXT_MAX], source=source)
        self.stats["host_events"] += 1
        return [Detection(event, parsed, line_no)]

    def _emit(self, parsed: ParsedXid, line: str, ts: float | None, source: str,
              line_no: int | None) -> list[Detection]:
        ts = self._time(parsed, ts)
        same_fault = "" if parsed.kind == "xid" and parsed.code == FELL_OFF_CODE else parsed.message
        if self._repeat((parsed.kind, parsed.code, parsed.pci_bus_id, parsed.gpu_instance, same_fault), ts):
            return []
        pci = parsed.pci_bus_id
        event = XidEvent(
            **self.labels, ts=ts, kind=parsed.kind, code=parsed.code, pci_bus_id=pci,
            gpu_index=self.gpu_index_by_pci.get(pci) if pci else None,
            gpu_uuid=self.uuid_by_pci.get(pci) if pci else None, gpu_instance=parsed.gpu_instance, pid=parsed.pid,
            process=parsed.process, severity=parsed.severity, caused_by=parsed.caused_by,
            recovery_action=parsed.recovery_action, unit=parsed.unit, link=parsed.link, message=parsed.message,
            raw_line=line, source=source,
        )
        self.stats["events"] += 1
        return [Detection(event, parsed, line_no)]
