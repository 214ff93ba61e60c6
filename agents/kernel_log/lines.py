"""Pure parsing of one kernel-log line: XID and SXid lines in every NVRM variant, with any log prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from schemas.pci import normalize_pci

PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{PCI})(?:\.(?P<fn>[0-7]))?(?: GPU-I:(?P<gi>\d+))?[^)]*\): "
                  r"(?P<code>\d{1,9})(?!\d)(?:, ?(?P<rest>.*))?")
_SXID = re.compile(rf"(?:nvidia-(?P<dev>nvswitch\d+): )?SXid \((?:PCI:)?(?P<pci>{PCI})(?:\.(?P<fn>[0-7]))?\): "
                   r"(?P<code>\d{1,9})(?!\d)(?:, ?(?P<rest>.*))?")
_LEGACY = re.compile(r"(?:^|[\s:\]])XID (?P<code>\d{1,3}) (?P<rest>\S.*)")  # dynamic-page-retirement doc form
_SXID_MORE = ("Severity ", "Data {")  # second and third line of one SXid report: not events of their own
_SXID_SEV = re.compile(r"(?P<sev>Non-fatal|Nonfatal|Fatal)(?:, ?(?:Link (?P<link>-?\d+) ?)?(?P<text>.*))?")
_PID = re.compile(r"pid=(?:'?<unknown>'?|(?P<pid>\d+)), ?")
_NAME = re.compile(r"name=(?P<name>.*?)(?:, |$)")
_CHANNEL = re.compile(r"(?:Ch|Channel|channel)(?: ID)? (?:0x)?(?P<ch>[0-9a-fA-F]{8})\b")
_CAUSED = re.compile(r"caused by previous Xid (?P<xid>\d+)")
_RECOVERY = re.compile(r"GPU recovery action changed from 0x(?P<old>[0-9a-fA-F]+) \((?P<old_label>[^)]*)\) "
                       r"to 0x(?P<new>[0-9a-fA-F]+) \((?P<new_label>[^)]*)\)")
_NVLINK5 = re.compile(r"(?P<unit>[A-Z][A-Z0-9_]*) (?P<sev>Link Fatal|Non-?fatal|Fatal) (?:XC\d+ )?(?:i\d+ )?"
                      r"Link (?P<link>-?\d+)(?: \((?P<regs>[^)]*)\))?")
_NVLINK74 = re.compile(r"NVLink: (?:\w+ )?error detected on link (?P<link>\d+)(?:\((?P<regs>[^)]*)\))?")
_HEX = re.compile(r"0x([0-9a-fA-F]+)")

_UPTIME = re.compile(r"\[\s*(\d+\.\d+)\]")
_DMESG_T = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_SYSLOG = re.compile(r"^\s*(?:<\d+>)?([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)(?: (\S+))? kernel:")
_ISO_HOST = re.compile(r"^\s*\S+T\S+ (\S+) kernel:")


@dataclass(slots=True)
class ParsedXid:
    """What one XID/SXid line says; `message` is the text after 'CODE, ' verbatim, prefix fields are optional."""

    kind: str
    code: int
    pci_bus_id: str | None
    message: str
    gpu_instance: int | None = None
    pid: int | None = None
    process: str | None = None
    channel: int | None = None
    severity: str | None = None
    unit: str | None = None
    link: int | None = None
    registers: tuple[int, ...] = ()
    caused_by: int | None = None
    recovery_action: int | None = None
    recovery_label: str | None = None
    device: str | None = None
    uptime_s: float | None = None
    wall_ts: float | None = None
    syslog_stamp: str | None = None
    log_host: str | None = None
    fell_off_text: bool = False
    followup: bool = False  # from an SXid report's Severity/Data line: its first line was not seen


def parse_prefix(prefix: str, parsed: ParsedXid) -> None:
    """Fill the timestamps and host found before the NVRM text (dmesg, dmesg -T, syslog, dmesg -x, printk caller)."""
    if not prefix.strip():
        return
    try:
        _stamps(prefix, parsed)
    except (ValueError, OverflowError, OSError):  # an impossible date in a well-shaped stamp: keep the line
        parsed.wall_ts = None
    if m := _UPTIME.search(prefix):
        parsed.uptime_s = float(m.group(1))


def _stamps(prefix: str, parsed: ParsedXid) -> None:
    if m := _DMESG_T.search(prefix):
        parsed.wall_ts = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
    elif m := _ISO.search(prefix):
        iso = m.group(1) + (f".{m.group(2)[:6]}" if m.group(2) else "") + (m.group(3) or "")
        parsed.wall_ts = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
        if h := _ISO_HOST.match(prefix):
            parsed.log_host = h.group(1)
    elif m := _SYSLOG.match(prefix):
        parsed.syslog_stamp, parsed.log_host = m.group(1), m.group(2)


def _registers(text: str | None) -> tuple[int, ...]:
    return tuple(int(h, 16) for h in _HEX.findall(text)) if text else ()


def _xid_details(parsed: ParsedXid, rest: str) -> None:
    pos = 0
    if m := _PID.match(rest):
        parsed.pid = int(m.group("pid")) if m.group("pid") else None
        pos = m.end()
    if m := _NAME.match(rest, pos):
        name = m.group("name").strip()
        parsed.process = None if name in ("<unknown>", "'<unknown>'", "") else name
        pos = m.end()
    if m := _CHANNEL.match(rest, pos):
        parsed.channel = int(m.group("ch"), 16)
    if "caused by previous Xid" in rest and (m := _CAUSED.search(rest)):
        parsed.caused_by = int(m.group("xid"))
    if parsed.code == 154 and (m := _RECOVERY.search(rest)):
        parsed.recovery_action, parsed.recovery_label = int(m.group("new"), 16), m.group("new_label")
    elif m := _NVLINK5.match(rest, pos):
        parsed.unit, parsed.severity, parsed.link = m.group("unit"), m.group("sev"), int(m.group("link"))
        parsed.registers = _registers(m.group("regs"))
    elif "NVLink:" in rest and (m := _NVLINK74.search(rest, pos)):
        parsed.link, parsed.registers = int(m.group("link")), _registers(m.group("regs"))


def parse_sxid_followup(line: str) -> ParsedXid | None:
    """The second or third line of an SXid report (`..., Severity ...` or `..., Data {...}`) as the report it belongs
    to, marked `followup`: parse_line() leaves these out, and KernelLogParser uses them only when the report's first
    line was never seen (rotated away, rate-limited). Never raises on any text."""
    if "SXid" not in line or not (m := _SXID.search(line)):
        return None
    rest = m.group("rest") or ""
    if not rest.startswith(_SXID_MORE):
        return None
    parsed = ParsedXid("sxid", int(m.group("code")), normalize_pci(f"{m.group('pci')}.{m.group('fn') or 0}"),
                       rest, device=m.group("dev"), followup=True)
    parse_prefix(line[:m.start()], parsed)
    return parsed


def parse_line(line: str) -> ParsedXid | None:
    """One XID or SXid line -> its fields; None for every other line (SXid 'Severity'/'Data' follow-ups included).

    Never raises on any text.
    """
    if "Xid" not in line and "XID " not in line:
        return None
    if m := _XID.search(line):
        rest = m.group("rest") or ""
        gi = m.group("gi")
        parsed = ParsedXid("xid", int(m.group("code")), normalize_pci(f"{m.group('pci')}.{m.group('fn') or 0}"),
                           rest, gpu_instance=int(gi) if gi else None)
        _xid_details(parsed, rest)
    elif m := _SXID.search(line):
        rest = m.group("rest") or ""
        if rest.startswith(_SXID_MORE):
            return None
        parsed = ParsedXid("sxid", int(m.group("code")), normalize_pci(f"{m.group('pci')}.{m.group('fn') or 0}"),
                           rest, device=m.group("dev"))
        if s := _SXID_SEV.match(rest):
            parsed.severity = s.group("sev")
            parsed.link = int(s.group("link")) if s.group("link") else None
    elif "XID " in line and (m := _LEGACY.search(line)):
        parsed = ParsedXid("xid", int(m.group("code")), None, m.group("rest"))
    else:
        return None
    parse_prefix(line[:m.start()], parsed)
    return parsed
