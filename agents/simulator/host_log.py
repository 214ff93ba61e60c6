"""Kernel-log lines a failing NIC or disk writes, as HostEvent dicts: each line is read by the agent's own parser
(agents/kernel_log/host_lines.py), so the simulated events carry exactly what a real host's would."""

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


def lines(spec, ts: float, *, host: str, rack: str, cluster: str) -> list[dict]:
    """The HostEvent dicts of a nic_down or ssd_error that starts at `ts`."""
    if spec.kind == "nic_down":
        texts = [(dt, line.format(pci=NIC_PCI[spec.port])) for dt, line in NIC_LINES]
    else:
        texts = [(dt, line.format(dev=spec.device)) for dt, line in SSD_LINES]
    out = []
    for dt, text in texts:
        parsed = parse_host_line(text)
        if parsed is None:  # a line the parser does not know: the simulator would claim a signal no agent sends
            raise ValueError(f"the kernel-log parser does not read the simulated line {text!r}")
        out.append({"host": host, "rack": rack, "cluster": cluster, "ts": ts + dt, "subsystem": parsed.subsystem,
                    "code": parsed.code, "device": parsed.device, "severity": parsed.severity,
                    "message": parsed.message, "raw_line": text, "source": "simulator"})
    return out
