"""`fleetpulse xid parse|classify`: read XID/SXid lines from a log, or look one code up in the catalog."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from dataclasses import asdict

import orjson

from agents.kernel_log import Detection, KernelLogParser
from core.errors import ConfigError
from schemas.events import XidEvent
from schemas.xid_catalog import RECOVERY_ACTIONS, first_bin, lookup

EXTRA_FIELDS = ("channel", "unit", "link", "registers", "recovery_action", "recovery_label", "device", "log_host",
                "fell_off_text")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["parse", "classify"],
                   help="parse: one JSON object per XID/SXid event in FILE; classify: catalog entry and bin of CODE")
    p.add_argument("target", nargs="?", help="parse: a log file (default: stdin); classify: the code")
    p.add_argument("--kind", choices=["xid", "sxid"], default="xid", help="classify: XID or NVSwitch SXid")
    p.add_argument("--severity", help="classify: the line's Fatal/Nonfatal word (NVLink5 Xids, SXids)")
    p.add_argument("--caused-by", type=int, help="classify: the 'caused by previous Xid N' of an Xid 45")
    p.add_argument("--recovery-action", type=int, help="classify: the new recovery action of an Xid 154 (0-7)")
    p.add_argument("--host", default=socket.gethostname() or "localhost", help="parse: host label of the events")
    p.add_argument("--dedup-window", type=float, default=10.0,
                   help="parse: seconds within which an exact repeat is counted, not printed (0 = print all)")


def detection_json(d: Detection) -> dict:
    """The XidEvent, the rest of what the line said, its line number, and the first bin with the catalog action."""
    event, parsed = d.event, d.parsed
    bin_, action = first_bin(event.code, event.kind, severity=event.severity, caused_by=event.caused_by,
                             recovery_action=parsed.recovery_action)
    out = event.model_dump()
    out.update({name: getattr(parsed, name) for name in EXTRA_FIELDS})
    out.update(line=d.line_no, bin=bin_.value, catalog_action=action)
    return out


def _parse(args: argparse.Namespace) -> int:
    parser = KernelLogParser(host=args.host, dedup_window_s=args.dedup_window, source="file")
    try:
        stream = sys.stdin if args.target in (None, "-") else open(args.target, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read {args.target}: {exc.strerror or exc}") from exc
    out = sys.stdout.buffer
    try:
        with stream:
            for number, line in enumerate(stream, 1):
                for detection in parser.feed(line.rstrip("\r\n"), line_no=number):
                    if isinstance(detection.event, XidEvent):  # NIC, disk and CPU lines: the agent's, not this tool's
                        out.write(orjson.dumps(detection_json(detection)) + b"\n")
        out.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    s = parser.stats
    print(f"{s['lines']} lines, {s['events']} events, {s['repeats']} repeats not printed, "
          f"{s['uuids_learned']} GPU UUIDs learned", file=sys.stderr)
    return 0


def _classify(args: argparse.Namespace) -> int:
    try:
        code = int(args.target, 0)
    except (TypeError, ValueError):
        raise ConfigError(f"classify needs an integer code, got {args.target!r}") from None
    bin_, action = first_bin(code, args.kind, severity=args.severity, caused_by=args.caused_by,
                             recovery_action=args.recovery_action)
    entry = lookup(code) if args.kind == "xid" else None
    result = {"kind": args.kind, "code": code, "bin": bin_.value, "catalog_action": action,
              "entry": asdict(entry) if entry else None}
    if args.recovery_action is not None:
        result["recovery_action"] = RECOVERY_ACTIONS.get(args.recovery_action, "UNKNOWN")
    sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def run(args: argparse.Namespace) -> int:
    return _parse(args) if args.action == "parse" else _classify(args)
