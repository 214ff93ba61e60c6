"""NVIDIA's XID catalog as data, and the first fault bin an XID or NVSwitch SXid gets from it."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from schemas.analytics import FaultBin

IGNORE, RETRY, RESET, REBOOT, INSPECT = (FaultBin.IGNORE, FaultBin.RETRY, FaultBin.RESET, FaultBin.REBOOT,
                                         FaultBin.INSPECT)
MODELS = {"a100": "A100", "h100": "H100", "b100": "B100", "gb200": "GB200"}
UNKNOWN = "UNKNOWN"

# The catalog's immediate action -> our bin: the mildest step the catalog says clears the fault. History
# (repeats, reboots that did not help) escalates later, in the fault-bin stage, never here.
BIN_BY_ACTION: dict[str, FaultBin] = {
    "IGNORE": IGNORE,
    "RESTART_APP": RETRY,
    # 159 CHI non-data: NONFATAL in NVSentinel, investigatory SYMPATHETIC_REPORT_SOLO; the app on the C2C/UVM path
    # dies, the GPU stays usable, so restart the app (a solo repeat escalates by history).
    "CHECK_UVM": RETRY,
    "RESET_GPU": RESET,
    "WORKFLOW_XID_48": RESET,      # DBE: uncorrectable, a GPU reset (or reboot) clears it; remap limits escalate later
    "WORKFLOW_NVLINK_ERR": RESET,  # 74: "reset GPU or reboot node to clear"; the register decode may blame the peer
    "RESTART_BM": REBOOT,
    "RESTART_VM": REBOOT,
    "CONTACT_SUPPORT": INSPECT,    # also every code the catalog marks Unused on Ampere and newer
    "CHECK_MECHANICALS": INSPECT,
    "UPDATE_SWFW": INSPECT,
}
# Codes whose action cell is blank or free text. 171/172 only ever add DRAM/SRAM detail to an Xid 48, so they take
# 48's bin; the others (162-169 power smoothing, PCIe timeout, WPR, SEC2 halt) need a person: inspect.
BLANK_ACTION_BINS: dict[int, FaultBin] = {171: RESET, 172: RESET}

# nvmlGpuRecoveryAction_t (Xid 154 'changed ... to 0xN', NVML field 230) -> bin.
RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET",
                    5: "RECOVER_IMEX_DOMAIN", 6: "BUS_RESET", 7: "SYSTEM_REBOOT"}
RECOVERY_BINS = {0: IGNORE, 1: RESET, 2: REBOOT, 3: RESET, 4: RESET, 5: INSPECT, 6: RESET, 7: REBOOT}

# SXid: the codes REFERENCE.md §1b names (buckets from NVSentinel's sxiderrorsmapping.csv). RESET_FABRIC resets the
# NVSwitches and the GPUs of the baseboard without a reboot, so it is `reset`.
SXID_CODES: dict[int, tuple[FaultBin, str]] = {
    10001: (IGNORE, "IGNORE"),            # host PRIV error
    10002: (IGNORE, "IGNORE"),            # host PRIV timeout
    10003: (RESET, "RESET_FABRIC"),       # unhandled interrupt
    10004: (INSPECT, "CHECK_THERMALS"),   # thermal event start
    10005: (IGNORE, "IGNORE"),            # thermal event end
    10006: (RESET, "RESET_FABRIC"),       # thermal shutdown
    10007: (RESET, "RESET_FABRIC"),       # IO failure
    10008: (RESET, "RESET_FABRIC"),       # firmware initialisation failure
    12028: (RESET, "RESET_FABRIC"),       # egress PRIVRSPERR: NVLink traffic stalled, jobs abort with Xid 45
}
# Ranges next (NVLIPT link-layer errors point at cables/signal integrity), then the line's own severity: the Fabric
# Manager guide's Fatal SXids need the fabric reset, Non-fatal ones need nothing (repeats escalate by history).
SXID_RANGES: tuple[tuple[int, int, FaultBin, str], ...] = ((18001, 18020, INSPECT, "INVESTIGATE_LINK_SI"),)


@dataclass(frozen=True)
class CatalogEntry:
    """One row of reference/xid_catalog.csv; `applies` maps A100/H100/B100/GB200 to True, False or None (blank)."""

    code: int
    mnemonic: str
    description: str
    applies: dict = field(hash=False)
    immediate_action: str
    investigatory_action: str


def _flag(cell: str) -> bool | None:
    return {"Y": True, "N": False}.get(cell.strip())


@lru_cache(maxsize=1)
def catalog() -> dict[int, CatalogEntry]:
    """The packaged catalog, read once per process."""
    text = resources.files("schemas").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    return {
        int(row["code"]): CatalogEntry(
            code=int(row["code"]), mnemonic=row["mnemonic"], description=row["description"],
            applies={name: _flag(row[col]) for col, name in MODELS.items()},
            immediate_action=row["immediate_action"].strip(), investigatory_action=row["investigatory_action"].strip(),
        )
        for row in csv.DictReader(io.StringIO(text))
    }


def lookup(code: int) -> CatalogEntry | None:
    return catalog().get(code)


def recovery_bin(action: int) -> FaultBin:
    """Bin for an nvmlGpuRecoveryAction_t value; values NVML does not define yet go to a person."""
    return RECOVERY_BINS.get(action, INSPECT)


def _is_nonfatal(severity: str | None) -> bool:
    return severity is not None and severity.replace("-", "").lower().startswith("nonfatal")


def _sxid_bin(code: int, severity: str | None) -> tuple[FaultBin, str]:
    if code in SXID_CODES:
        return SXID_CODES[code]
    for low, high, bin_, action in SXID_RANGES:
        if low <= code <= high:
            return bin_, action
    if severity is None:
        return INSPECT, UNKNOWN
    return (IGNORE, "SXID_NONFATAL") if _is_nonfatal(severity) else (RESET, "SXID_FATAL")


def first_bin(code: int, kind: str = "xid", *, severity: str | None = None, caused_by: int | None = None,
              recovery_action: int | None = None) -> tuple[FaultBin, str]:
    """The catalog's first answer for one line, as (bin, catalog immediate action); unknown codes -> inspect.

    The keyword arguments carry what the line itself adds, for the catalog's workflow buckets:
    WORKFLOW_XID_45 follows the Xid named by 'caused by previous Xid N', else ignore (the other Xid is binned on
    its own); WORKFLOW_NVLINK5_ERR (144-150) is `ignore` for a Nonfatal unit error and `reset` otherwise (these
    Xids take part in Xid 154 reporting, so a Nonfatal one that needs more is followed by a 154); XID_154 takes
    the bin of its new recovery action, or inspect when the line did not say.
    """
    if kind == "sxid":
        return _sxid_bin(code, severity)
    entry = lookup(code)
    if entry is None:
        return INSPECT, UNKNOWN
    action = entry.immediate_action
    if action in BIN_BY_ACTION:
        return BIN_BY_ACTION[action], action
    if action == "WORKFLOW_XID_45":
        if caused_by is not None and caused_by != code:
            return first_bin(caused_by)[0], action
        return IGNORE, action
    if action == "WORKFLOW_NVLINK5_ERR":
        return (IGNORE if _is_nonfatal(severity) else RESET), action
    if action == "XID_154":
        return (INSPECT if recovery_action is None else recovery_bin(recovery_action)), action
    return BLANK_ACTION_BINS.get(code, INSPECT), action
