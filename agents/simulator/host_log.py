"""Kernel-log lines a failing NIC, cable, disk, filesystem, CPU or DIMM writes, as HostEvent dicts: each line is read
by the agent's own parser (agents/kernel_log/host_lines.py), so the simulated events carry exactly what a real host's
would. The lines are real ones (tests/data/host_kernel_lines.tsv, with where each was posted) with the device put in."""

from __future__ import annotations

from agents.kernel_log.host_lines import parse_host_line
from agents.simulator.network import NIC_PCI

# (seconds after the fault starts, line); {pci} is the NIC's PCI address, {dev} the NVMe controller (nvme0). The
# shapes are the kernel's (mlx5 health.c, nvme pci.c/core.c, blk-core.c, ext4 super.c): see the parser's table.
NIC_LINES = (
    (0.0, "mlx5_core {pci}: wait_func_handle_exec_timeout:1108:(pid 1634): cmd[0]: QUERY_VPORT_COUNTER(0x770) "
          "No done completion"),
    (2.0, "mlx5_core {pci}: poll_health:955:(pid 0): device's health compromised - reached miss count"),
)
SSD_LINES = (
    (0.0, "nvme {dev}: I/O 17 QID 5 timeout, aborting"),
    (30.0, "nvme {dev}: I/O 17 QID 5 timeout, reset controller"),
    (60.0, "nvme {dev}: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff"),
    (60.5, "nvme {dev}: Removing after probe failure status: -19"),
    (61.0, "I/O error, dev {dev}n1, sector 1953525072 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0"),
    (61.5, "EXT4-fs error (device {dev}n1p1): __ext4_find_entry:1683: inode #2: comm python: reading directory "
           "lblock 0"),
    (62.0, "EXT4-fs ({dev}n1p1): Remounting filesystem read-only"),
)


# An uncorrected machine check the kernel recovered from (the page poisoned): the bank's status with UC set, the
# EDAC driver's DIMM, the process killed (arch/x86/kernel/cpu/mce/core.c, drivers/edac/edac_mc.c).
MCE_LINES = (
    (0.0, "mce: [Hardware Error]: CPU 12: Machine Check Exception: 0 Bank 7: bc00000000010090"),
    (0.0, "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x1d2f3c "
          "offset:0x0 grain:32 -  err_code:0000:009f socket:1 imc:0 rank:0)"),
    (0.1, "mce: Uncorrected hardware memory error in user-access at 1d2f3c000"),
)
# XFS shutting down on a failed log write, as pre-5.14 kernels and newer ones print it (fs/xfs/xfs_log.c,
# xfs_fsops.c); the disk itself says nothing.
FS_LINES = (
    (0.0, "XFS ({dev}): log I/O error -5"),
    (0.0, "XFS ({dev}): xfs_do_force_shutdown(0x2) called from line 1196 of file fs/xfs/xfs_log.c. Return address "
          "= ffffffffc12dea8a"),
    (0.0, "XFS ({dev}): Log I/O Error Detected. Shutting down filesystem"),
    (30.0, "XFS ({dev}): xfs_log_force: error -5 returned."),
)
# mlx5 events.c port_module: the cable's module in error; a port that never had a cable, at boot.
CABLE_ERROR_LINES = ((0.0, "mlx5_core {pci}: Port module event[error]: module 0, Cable error, Bus stuck (I2C or data "
                           "shorted)"),)
CABLE_ABSENT_LINES = ((0.0, "mlx5_core {pci}: Port module event: module 0, Cable unplugged"),)
BY_KIND = {"nic_down": NIC_LINES, "ssd_error": SSD_LINES, "machine_check": MCE_LINES, "fs_shutdown": FS_LINES,
           "cable_error": CABLE_ERROR_LINES, "cable_absent": CABLE_ABSENT_LINES}


def lines(spec, ts: float, *, host: str, rack: str, cluster: str) -> list[dict]:
    """The HostEvent dicts of a fault of the host around the GPUs (agents/simulator/kinds.py HOST_LOG_KINDS) that
    starts at `ts`."""
    where = {"pci": NIC_PCI[spec.port] if hasattr(spec, "port") else "",
             "dev": getattr(spec, "device", "")}
    texts = [(dt, line.format(**where)) for dt, line in BY_KIND[spec.kind]]
    out = []
    for dt, text in texts:
        parsed = parse_host_line(text)
        if parsed is None:  # a line the parser does not know: the simulator would claim a signal no agent sends
            raise ValueError(f"the kernel-log parser does not read the simulated line {text!r}")
        out.append({"host": host, "rack": rack, "cluster": cluster, "ts": ts + dt, "subsystem": parsed.subsystem,
                    "code": parsed.code, "device": parsed.device, "severity": parsed.severity,
                    "message": parsed.message, "raw_line": text, "source": "simulator"})
    return out
