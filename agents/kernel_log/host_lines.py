"""Pure parsing of one kernel-log line about the host around the GPUs: its mlx5 NIC, its NVMe and block devices, its
ext4/XFS filesystems, its CPUs and memory (machine checks, APEI, EDAC). Each pattern names a HostEvent code.

The formats are the kernel's own (the file that prints each is named beside its pattern), and
tests/data/host_kernel_lines.tsv holds real lines for every code. The parser sees every kernel line, so a few cheap
substring tests run first and almost every line stops there (under a microsecond).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.kernel_log.lines import PCI, normalize_pci, parse_prefix
from schemas.limits import ID_MAX, TEXT_MAX

# code -> subsystem: the stream rules (streams/fault_bins/host_rules.py) are written against these names.
CODES = {
    "mlx5_health_compromised": "nic", "mlx5_cmd_timeout": "nic", "mlx5_module_error": "nic", "mlx5_cable_unplugged": "nic",
    "mlx5_pcie_power": "nic", "nic_link_down": "nic",
    "nvme_timeout": "storage", "nvme_controller_down": "storage", "storage_media_error": "storage",
    "block_io_error": "storage",
    "fs_error": "filesystem", "fs_readonly": "filesystem",
    "mce_uncorrected": "machine_check", "mce_corrected": "machine_check", "memory_ue": "machine_check",
    "memory_ce": "machine_check",
}

# mlx5_core prints '<driver> <PCI id>: ' (dev_err) or '<driver> <PCI id> <netdev>: ' (netdev_err) before its text.
_MLX5_DEV = re.compile(rf"mlx5_core (?P<pci>{PCI}\.[0-7])")
_NIC = (
    # health.c: poll_health, print_health_info (syndromes 0x8 and 0xb only), mlx5_health_try_recover,
    # mlx5_fw_fatal_reporter_err_work. The other lines of a health dump (assert_var, fw_ver, ...) say nothing new.
    (re.compile(r"device's health compromised|Fatal error \d+ detected|health recovery flow aborted"
                r"|health recovery failed|Driver is in error state\. Unloading"
                r"|synd 0x[0-9a-f]+: (?:unrecoverable hardware error|HW fatal error)"),
     "mlx5_health_compromised", "fatal"),
    # cmd.c: wait_func_handle_exec_timeout, wait_func, cb_timeout_handler.
    (re.compile(r"No done completion|timeout\. Will cause a leak of a command resource"), "mlx5_cmd_timeout", "error"),
    # events.c port_module: the [error] form carries the reason; an unplugged cable is the only other status worth one.
    (re.compile(r"Port module event\[error\]: module \d+"), "mlx5_module_error", "error"),
    # An unplugged cable is no module error: a port that never had one says so at every boot (the port's own readings
    # decide whether a link that was up is gone).
    (re.compile(r"Port module event: module \d+, Cable unplugged"), "mlx5_cable_unplugged", "warning"),
    # events.c mlx5_pcie_event.
    (re.compile(r"Detected insufficient power on the PCIe slot"), "mlx5_pcie_power", "warning"),
    # en_main.c mlx5e_update_carrier: netdev_info(netdev, "Link down").
    (re.compile(rf"mlx5_core {PCI}\.[0-7] [^\s:]+: Link down\b"), "nic_link_down", "warning"),
)

_FS = (
    # fs/ext4/super.c ext4_handle_error; fs/xfs/xfs_fsops.c xfs_do_force_shutdown (every kernel's wording) and
    # fs/xfs/xfs_log.c xlog_force_shutdown. Before the error forms: a shutdown line also names an I/O error.
    (re.compile(r"EXT4-fs \((?P<dev>[^)\s]+)\): Remounting filesystem read-only"), "fs_readonly", "fatal"),
    (re.compile(r"XFS \((?P<dev>[^)\s]+)\): (?:.*Shutting down filesystem|Filesystem has been shut down"
                r"|xfs_do_force_shutdown\(0x[0-9a-f]+\) called from line)"), "fs_readonly", "fatal"),
    # fs/ext4/super.c __ext4_error*; fs/xfs/xfs_error.c, xfs_buf.c xfs_buf_ioerror_alert, xfs_log.c.
    (re.compile(r"EXT4-fs error \(device (?P<dev>[^)\s]+)\)"), "fs_error", "error"),
    (re.compile(r"XFS \((?P<dev>[^)\s]+)\): (?:Corruption detected|Metadata corruption detected"
                r"|Metadata CRC error detected|metadata I/O error|log I/O error|xfs_log_force: error -?\d+ returned)"),
     "fs_error", "error"),
)

_STORAGE = (
    # drivers/nvme/host/pci.c nvme_warn_reset, nvme_remove_dead_ctrl, nvme_reset_work; core.c nvme_wait_ready.
    (re.compile(r"nvme (?P<dev>nvme\d+): (?:controller is down; will reset|Removing after probe failure"
                r"|Device not ready; aborting (?:reset|initialisation)|Disabling device after reset failure)"),
     "nvme_controller_down", "fatal"),
    # drivers/nvme/host/pci.c nvme_timeout: 'I/O 5 QID 3 timeout, aborting', 'I/O tag 12 (400c) opcode 0x9 (Admin
    # Cmd) QID 0 timeout, reset controller', '... timeout, completion polled'.
    (re.compile(r"nvme (?P<dev>nvme\d+): I/O (?:tag )?\d+ (?:.*? )?QID \d+ timeout"), "nvme_timeout", "warning"),
    # drivers/nvme/host/core.c nvme_log_error; drivers/scsi/constants.c sense key of a SCSI/SATA disk.
    (re.compile(r"(?P<dev>nvme\d+(?:c\d+)?n\d+): .*?Unrecovered Read Error"), "storage_media_error", "error"),
    # core.c nvme_log_error, one line per failed I/O command: '<disk>: <op>(0x<opcode>) @ LBA <n>, <n> blocks, <status>
    # (sct 0x<n> / sc 0x<n>)'. A failed admin command ('nvme0: Identify(0x6), ...') is a probe's answer: no fault.
    (re.compile(r"(?P<dev>nvme\d+(?:c\d+)?n\d+): [\w /]+\(0x[0-9a-f]+\) @ LBA \d+, \d+ blocks, [^(]+\(sct 0x"),
     "block_io_error", "error"),
    # drivers/scsi/constants.c scsi_print_sense: the sense key line and its additional sense code line.
    (re.compile(r"sd [\d:]+: \[(?P<dev>[^\]\s]+)\](?: tag#\d+)? +(?:Sense Key : Medium Error"
                r"|Add\. Sense: Unrecovered read error)"), "storage_media_error", "error"),
    # block/blk-core.c (blk_print_req_error, older blk_update_request/print_req_error/end_request): status, device.
    (re.compile(r"(?:(?:blk_update_request|print_req_error|blk_print_req_error|end_request): )?"
                r"(?P<status>critical medium|I/O|timeout|critical target|critical nexus|recoverable transport"
                r"|protection) error, dev (?P<dev>[^\s,]+), sector"), "block_io_error", "error"),
    # fs/buffer.c buffer_io_error ('on dev', older kernels 'on device').
    (re.compile(r"Buffer I/O error on dev(?:ice)? (?P<dev>[^\s,]+), logical block"), "block_io_error", "error"),
)

# arch/x86/kernel/cpu/mce/core.c: print_mce, mce_panic, kill_me_maybe, mce_notify_irq.
_MCE_BANK = re.compile(r"(?:mce: )?\[Hardware Error\]: CPU (?P<cpu>\d+): Machine Check(?: Exception)?: [0-9a-fA-F]+ "
                       r"Bank (?P<bank>\d+): (?P<status>[0-9a-fA-F]{1,16})\b")
_MCE_FATAL = re.compile(r"(?:mce: )?\[Hardware Error\]: Machine check: |mce: Uncorrected hardware memory error in ")
_MCE_LOGGED = re.compile(r"(?:\w+: )?\[Hardware Error\]: Machine check events logged")
# kernel/panic.c panic() with mce_panic's messages (arch/x86/kernel/cpu/mce/core.c, severity.c): the host went down
# on an uncorrected machine check (its last line, where a netconsole or the next boot's pstore keeps it).
_MCE_PANIC = re.compile(r"Kernel panic - not syncing: (?:Fatal (?:local )?[Mm]achine check|Machine check from unknown"
                        r" source|Timeout: Not all CPUs entered broadcast exception handler)")
# drivers/edac/skx_common.c skx_mce_output_error, sb_edac.c, i10nm: the bank's status as the EDAC driver prints it.
_EDAC_BANK = re.compile(r"EDAC [\w-]+ MC\d+: CPU (?P<cpu>\d+): Machine Check (?:Event|Exception): (?:0x)?[0-9a-fA-F]+ "
                        r"Bank (?P<bank>\d+): (?:0x)?(?P<status>[0-9a-fA-F]{1,16})\b")
# drivers/edac/mce_amd.c decode_smca_error/amd_decode_mce: AMD's decoded form of the same bank status.
_AMD_BANK = re.compile(r"\[Hardware Error\]: CPU:(?P<cpu>\d+) \([^)]*\) MC(?P<bank>\d+)_STATUS\[(?P<flags>[^\]]*)\]: "
                       r"0x(?P<status>[0-9a-fA-F]{1,16})\b")
# drivers/firmware/efi/cper.c cper_estatus_print (GHES, BERT): one 'event severity' line per error record.
_APEI = re.compile(r"(?:\{\d+\})?\[Hardware Error\]: event severity: (?P<sev>fatal|recoverable|corrected)\b")
_APEI_CODES = {"fatal": ("mce_uncorrected", "fatal"), "recoverable": ("mce_uncorrected", "error"),
              "corrected": ("mce_corrected", "corrected")}
# drivers/edac/edac_mc.c edac_ce_error/edac_ue_error: 'EDAC MC0: 1 CE memory read error on <label> (...)', some
# drivers' with their name before the controller ('EDAC skx MC0: ...').
_EDAC = re.compile(r"EDAC (?:[\w-]+ )?MC(?P<mc>\d+): (?P<n>\d+) (?P<kind>CE|UE) (?:.*? )?on (?P<label>.+?)(?: \(|$)")
_UC = 1 << 61  # MCi_STATUS.UC: the error was not corrected


@dataclass(slots=True)
class ParsedHost:
    """What one host line says: its HostEvent code and what it names; `message` is the kernel's text, prefix off."""

    subsystem: str
    code: str
    device: str | None
    severity: str
    message: str
    uptime_s: float | None = None
    wall_ts: float | None = None
    syslog_stamp: str | None = None
    log_host: str | None = None


Found = tuple[int, str, str, str | None]  # where the kernel's text starts, code, severity, device


def _nic(line: str) -> Found | None:
    for pattern, code, severity in _NIC:
        if m := pattern.search(line):
            dev = _MLX5_DEV.search(line)
            return (min(line.find("mlx5_"), m.start()), code, severity,
                    normalize_pci(dev.group("pci")) if dev else None)
    return None


def _first(patterns, line: str) -> Found | None:
    for pattern, code, severity in patterns:
        if m := pattern.search(line):
            if m.groupdict().get("status") == "critical medium":
                code = "storage_media_error"
            return m.start(), code, severity, m.group("dev")
    return None


def _bank(m: re.Match, deferred: bool) -> Found:
    """A bank's status: UC set is uncorrected; AMD's Deferred (poisoned, not yet consumed) is an uncorrected error
    the CPU has not had to act on yet."""
    if int(m.group("status"), 16) & _UC:
        code, severity = "mce_uncorrected", "fatal"
    else:
        code, severity = ("mce_uncorrected", "error") if deferred else ("mce_corrected", "corrected")
    return m.start(), code, severity, f"CPU {m.group('cpu')} bank {m.group('bank')}"


def _machine_check(line: str) -> Found | None:
    if "Kernel panic" in line:
        m = _MCE_PANIC.search(line)
        return (m.start(), "mce_uncorrected", "fatal", None) if m else None
    if "EDAC " in line and "Machine Check" in line and (m := _EDAC_BANK.search(line)):
        return _bank(m, deferred=False)
    if "EDAC " in line and (m := _EDAC.search(line)):
        if m.group("n") == "0":
            return None
        label = m.group("label").strip()
        device = f"MC{m.group('mc')}" + ("" if label == "unknown memory" else f" {label}")
        code, severity = ("memory_ce", "corrected") if m.group("kind") == "CE" else ("memory_ue", "fatal")
        return m.start(), code, severity, device
    if "Hardware Error" not in line and "mce: " not in line:
        return None
    if m := _MCE_BANK.search(line):
        return _bank(m, deferred=False)
    if m := _AMD_BANK.search(line):
        return _bank(m, deferred="Deferred" in m.group("flags").split("|"))
    if m := _MCE_FATAL.search(line):
        return m.start(), "mce_uncorrected", "fatal", None
    if m := _MCE_LOGGED.search(line):
        return m.start(), "mce_corrected", "corrected", None
    if m := _APEI.search(line):
        return (m.start(), *_APEI_CODES[m.group("sev")], None)
    return None


def _match(line: str) -> Found | None:
    if "mlx5_" in line:
        return _nic(line)
    if "EXT4-fs" in line or "XFS (" in line:
        return _first(_FS, line)
    if ("nvme" in line or "error, dev " in line or "Buffer I/O error" in line or "Medium Error" in line
            or "Unrecovered read error" in line):
        if found := _first(_STORAGE, line):
            return found
    if "Hardware Error" in line or "EDAC " in line or "mce: " in line or "Kernel panic" in line:
        return _machine_check(line)
    return None


def parse_host_line(line: str) -> ParsedHost | None:
    """One kernel-log line about the host -> its code and fields; None for every other line (XID lines included:
    none of these patterns occurs in an NVRM line). Never raises on any text."""
    found = _match(line)
    if found is None:
        return None
    start, code, severity, device = found
    parsed = ParsedHost(CODES[code], code, device[:ID_MAX] if device else None, severity,
                        line[start:].strip()[:TEXT_MAX])
    parse_prefix(line[:start], parsed)
    return parsed
