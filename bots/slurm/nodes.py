"""A Slurm node as `scontrol -o show node` prints it, and what the bot concludes from it. Pure: no command runs here.

Ownership lives in the node's drain reason, where Slurm keeps it across restarts of the bot and of slurmctld:
`fleetpulse: <repair> <evidence> <event_id>`. Slurm appends its own notes (`: reboot issued : reboot complete`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

OWN_PREFIX = "fleetpulse:"
# Suffix characters sinfo/scontrol put on a base state: '*' not responding, '~' powered off, '#' powering up, ...
_MARKS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN", "!": "POWER_DOWN",
          "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "-": "PLANNED"}
_REASON = re.compile(r" Reason=(.*?) \[([^\]@]*)@([^\]]*)\](?= |$)")
_FIELD = re.compile(r"(?:^| )(NodeName|State|BootTime)=(\S*)")
_REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
# One node, by name: Slurm would expand 'gpu[001-128]' or 'a,b' to many, and '-x' reads as an option.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class SlurmNode:
    """One node: its base state (IDLE, ALLOCATED, MIXED, DOWN, ...), its flags (DRAIN, COMPLETING, REBOOT_ISSUED,
    NOT_RESPONDING, ...) and its reason with who set it when."""

    name: str
    state: str
    flags: frozenset[str]
    reason: str = ""
    reason_by: str = ""
    reason_at: str = ""
    boot_time: str = ""

    @property
    def out_of_service(self) -> bool:
        """Slurm starts no job on it: drain-marked, down or failed."""
        return "DRAIN" in self.flags or self.state in ("DOWN", "FAIL") or "FAIL" in self.flags

    @property
    def runs_nothing(self) -> bool:
        """No job runs and none is completing (what Slurm calls DRAINED for a drain-marked node)."""
        return self.state in ("IDLE", "DOWN", "FAIL") and "COMPLETING" not in self.flags

    @property
    def drained(self) -> bool:
        """Out of service with nothing running: DRAINED (or DOWN), never DRAINING or COMPLETING."""
        return self.out_of_service and self.runs_nothing

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & _REBOOTING)

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def ours(self) -> bool:
        """Its reason is one this bot wrote: fleetpulse drained it and may return it."""
        return self.reason.startswith(OWN_PREFIX)

    @property
    def owner(self) -> str:
        """Who took it out, for a result's detail: 'root at 2026-12-03T06:18:57: bad fan'."""
        return f"{self.reason_by or 'unknown'} at {self.reason_at or '?'}: {self.reason or '(no reason)'}"

    @property
    def event_id(self) -> str:
        """The event id in an own reason (before Slurm's own ' : ...' notes); empty for any other."""
        if not self.ours:
            return ""
        words = self.reason.split(" : ", 1)[0].split()
        return words[-1] if len(words) > 2 else ""


def parse_show_node(line: str) -> SlurmNode:
    """One line of `scontrol -o show node NAME`."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(line):  # the first of each: a reason may quote "State=..." after the real one
        fields.setdefault(key, value)
    if "NodeName" not in fields or "State" not in fields:
        raise ValueError(f"not a node line: {line[:120]!r}")
    base, *flags = fields["State"].split("+")
    marks = set()
    while base and base[-1] in _MARKS:
        marks.add(_MARKS[base[-1]])
        base = base[:-1]
    reason = _REASON.search(line)
    return SlurmNode(name=fields["NodeName"], state=base.upper(), flags=frozenset({f.upper() for f in flags} | marks),
                     reason=reason[1].strip() if reason else "", reason_by=reason[2] if reason else "",
                     reason_at=reason[3] if reason else "", boot_time=fields.get("BootTime", ""))


def drain_reason(event: Mapping) -> str:
    """The reason this bot writes for a drain: `fleetpulse: <repair> <evidence> <event_id>`, short enough for
    `sinfo -R`; the evidence is the fault code, GPU and gates where the event names them, and the NVLink domain whose
    incident the drain is part of (`domain=<domain>`: the trays of one incident, found together with `sinfo -R`)."""
    evidence = event.get("evidence") or {}
    facts = [evidence[k] if k != "gpu_index" else f"gpu{evidence[k]}" for k in ("code", "gpu_index", "gates")
             if evidence.get(k)]
    if evidence.get("incident"):
        facts.append(f"domain={evidence['incident']}")
    words = [evidence.get("repair") or "inspect", *(_one_word(f) for f in facts), event["event_id"]]
    return f"{OWN_PREFIX} {' '.join(words)}"


def _one_word(text: str) -> str:
    """A fact as one word of the reason: Slurm keeps the reason as one string, and the event id must stay last."""
    return re.sub(r"[\s\[\]]+", "_", str(text))[:60]
