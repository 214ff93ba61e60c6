"""XID kernel-log lines in the real NVRM formats (REFERENCE.md §2), as the kernel-log collector publishes them."""

from __future__ import annotations

import time

import numpy as np

# Text after "NN, " per code. Shapes follow the verbatim lines in reference/xid_lines_sample.tsv; {pid}/{name}
# are the faulting process, {ch} a channel, {p}/{sp} framebuffer partition, {link} an NVLink, {w} hex words.
MESSAGES: dict[int, str] = {
    8: "pid={pid}, name={name}, Channel {ch:08x}",
    13: ("pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC {p}, TPC {sp}, SM 0): "
         "Illegal Instruction Parameter"),
    31: ("pid={pid}, name={name}, Ch {ch:08x}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC{p} GPCCLIENT_T1_{sp} "
         "faulted @ 0x7f3a_{w0:08x}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
    32: "pid={pid}, name={name}, Channel ID {ch:08x} intr 02000000",
    43: "pid={pid}, name={name}, Ch {ch:08x}",
    45: "pid={pid}, name={name}, Ch {ch:08x}",
    48: ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
         "at partition {p}, subpartition {sp}"),
    62: "{w0:08x} {w1:08x} 00000000 {w2:08x} {w3:08x} {w4:08x} {w5:08x} {w6:08x}",
    63: "pid={pid}, Row Remapper: New row marked for remapping, reset gpu to activate",
    64: "pid={pid}, Row Remapper: Failed to mark row for remapping, GPU memory remapping failure",
    74: ("pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link {link}"
         "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "pid={pid}, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "pid={pid}, Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "pid={pid}, name={name}, Ch {ch:08x}, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    119: "pid={pid}, name=nv_queue, Timeout waiting for RPC from GSP!",
    120: "pid='<unknown>', name=<unknown>, GSP task exception",
}
DEFAULT_MESSAGE = "pid={pid}, name={name}, Ch {ch:08x}"

# nvmlDeviceGpuRecoveryAction_t after the code (drivers >= R565 then log Xid 154); codes absent leave it unchanged.
RECOVERY_ACTION: dict[int, int] = {48: 1, 62: 1, 64: 1, 74: 1, 79: 2, 95: 1, 109: 1, 119: 1, 120: 1, 140: 1, 143: 1}
RECOVERY_LABELS = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P", 4: "Drain and Reset"}
# Codes whose usual cause is the application, not the card (ground truth's hardware flag).
SOFTWARE_CODES = frozenset({11, 13, 25, 31, 43, 45, 69})
# Fault bin a detector should reach from the catalog's immediate action alone.
EXPECTED_BIN = {13: "retry", 31: "retry", 43: "ignore", 48: "reset", 62: "reset", 63: "ignore", 64: "reset",
                74: "reset", 79: "reboot", 92: "ignore", 94: "retry", 95: "reset", 109: "reset", 119: "reset",
                120: "reset"}
PROCESSES = ("python3", "pt_main_thread", "python")


def short_pci(pci_bus_id: str) -> str:
    """'0000:18:00.0' -> '0000:18:00', the form inside 'NVRM: Xid (PCI:...)'."""
    return pci_bus_id.rsplit(".", 1)[0]


def kernel_prefix(ts: float, host: str) -> str:
    """The journald/syslog prefix, e.g. 'May 18 19:02:39 gpu-node-0003 kernel: ' (UTC)."""
    return time.strftime("%b %d %H:%M:%S", time.gmtime(ts)) + f" {host} kernel: "


def message_for(code: int, rng: np.random.Generator, *, pid: int | None = None) -> str:
    """A message body for `code` with plausible, seeded details."""
    words = rng.integers(0x20000000, 0x20ffffff, size=7)
    fields = {
        "pid": pid if pid is not None else int(rng.integers(1000, 4_000_000)),
        "name": PROCESSES[int(rng.integers(len(PROCESSES)))],
        "ch": int(rng.integers(1, 0x40)),
        "p": int(rng.integers(0, 8)),
        "sp": int(rng.integers(0, 2)),
        "link": int(rng.integers(0, 18)),
        **{f"w{i}": int(w) for i, w in enumerate(words)},
    }
    return MESSAGES.get(code, DEFAULT_MESSAGE).format(**fields)


def recovery_message(old: int, new: int) -> str:
    return (f"GPU recovery action changed from 0x{old:x} ({RECOVERY_LABELS.get(old, 'Unknown')}) "
            f"to 0x{new:x} ({RECOVERY_LABELS.get(new, 'Unknown')})")


def xid_event(*, ts: float, host: str, rack: str, cluster: str, gpu_index: int, gpu_uuid: str, pci_bus_id: str,
              code: int, message: str, caused_by: int | None = None) -> dict:
    """One XidEvent as a dict, with raw_line exactly as the kernel log would show it."""
    if caused_by is not None:
        message = f"{message} caused by previous Xid {caused_by}"
    line = f"NVRM: Xid (PCI:{short_pci(pci_bus_id)}): {code}, {message}"
    pid = None
    if message.startswith("pid=") and message[4:5].isdigit():
        pid = int(message[4:].split(",", 1)[0])
    name = None
    if ", name=" in message:
        name = message.split(", name=", 1)[1].split(",", 1)[0]
        name = None if name == "<unknown>" else name
    return {
        "host": host, "rack": rack, "cluster": cluster, "ts": ts, "kind": "xid", "code": code,
        "pci_bus_id": pci_bus_id, "gpu_index": gpu_index, "gpu_uuid": gpu_uuid, "gpu_instance": None,
        "pid": pid, "process": name, "severity": None, "caused_by": caused_by, "message": message,
        "raw_line": kernel_prefix(ts, host) + line, "source": "simulator",
    }
