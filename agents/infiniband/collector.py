"""InfinibandCollector: every InfiniBand / RoCE port of the host, read from /sys/class/infiniband, as a NetSample.

The formats are the kernel's (drivers/infiniband/core/sysfs.c): `state` "4: ACTIVE", `phys_state` "5: LinkUp",
`rate` "400 Gb/sec (4X NDR)" or "2.5 Gb/sec (1X SDR)", `link_layer` "InfiniBand" / "Ethernet", one decimal per
`counters/<name>` file. A file that is missing, refuses the read (some drivers answer EINVAL for a counter they do
not implement) or holds something else reads as None: a zero would claim a clean link nobody measured.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable

from schemas.limits import ID_MAX
from schemas.network import COUNTERS, MAX_PORTS, NetSample, PortReading
from schemas.validate import INT_RANGES

DEFAULT_ROOT = "/sys/class/infiniband"
_NAMED = re.compile(r"\d+:\s*(\S.*)")  # state_show "%d: %s", phys_state_show "%u: %s"
_RATE = re.compile(r"(\d+(?:\.\d+)?) Gb/sec\b")  # rate_show "%d%s Gb/sec (%dX%s)", the %s being "" or ".5"
_PCI = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # a VMD domain has 5 hex digits
_COUNTER_MAX = INT_RANGES["UInt64"][1]  # what the topic's validator takes (2**63 - 1), not a full UInt64
_RATE_MAX = next(m.le for m in PortReading.model_fields["rate_gbps"].metadata if hasattr(m, "le"))


def _read(path: str) -> str | None:
    """The file's text, stripped; None when it is absent, unreadable or empty (a port going away mid-read too)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return None
    return text or None


def _text(path: str) -> str | None:
    """A name-like value that fits its column; anything longer is garbage, not something to truncate."""
    text = _read(path)
    return text if text is not None and len(text) <= ID_MAX else None


def _named(path: str) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'."""
    text = _text(path)
    match = _NAMED.fullmatch(text) if text is not None else None
    return match.group(1) if match else None


def _counter(path: str) -> int | None:
    """A counter's decimal; None for anything else, or for a value the topic could not carry."""
    text = _read(path)
    if text is None or not text.isdigit():  # decoded as ASCII: no other script's digits get here
        return None
    value = int(text)
    return value if value <= _COUNTER_MAX else None


def _rate(path: str) -> tuple[float | None, str | None]:
    """(Gb/s, the text as read) from '400 Gb/sec (4X NDR)'; (None, None) for text that is not a rate."""
    text = _text(path)
    match = _RATE.match(text) if text is not None else None
    if match is None or float(match.group(1)) > _RATE_MAX:
        return None, None
    return float(match.group(1)), text


def _pci_bus_id(device_dir: str) -> str | None:
    """The PCI address the device's `device` link resolves to; None for a device with no PCI parent (rxe, siw)."""
    link = os.path.join(device_dir, "device")
    if not os.path.exists(link):
        return None
    name = os.path.basename(os.path.realpath(link))
    return name if _PCI.fullmatch(name) else None


def _netdev(device_dir: str, port_dir: str, port: int) -> str | None:
    """RoCE: the netdev of the port's GID 0. IB (GID 0 has no netdev, the read answers EINVAL): the IPoIB interface
    of the parent device whose dev_port is port - 1, or the device's only interface."""
    name = _text(os.path.join(port_dir, "gid_attrs", "ndevs", "0"))
    if name is not None:
        return name
    net = os.path.join(device_dir, "device", "net")
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return None
    for name in names:
        if _read(os.path.join(net, name, "dev_port")) == str(port - 1):
            return name
    return names[0] if len(names) == 1 else None


def _port(root: str, device: str, port: int) -> PortReading:
    device_dir = os.path.join(root, device)
    port_dir = os.path.join(device_dir, "ports", str(port))
    rate_gbps, rate = _rate(os.path.join(port_dir, "rate"))
    counters = {name: _counter(os.path.join(port_dir, "counters", name)) for name in COUNTERS}
    return PortReading(device=device, port=port, pci_bus_id=_pci_bus_id(device_dir),
                       netdev=_netdev(device_dir, port_dir, port),
                       link_layer=_text(os.path.join(port_dir, "link_layer")),
                       state=_named(os.path.join(port_dir, "state")),
                       phys_state=_named(os.path.join(port_dir, "phys_state")),
                       rate_gbps=rate_gbps, rate=rate, **counters)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # absent, or removed since its parent was listed (a device unbinding)
        return []


def read_ports(root: str = DEFAULT_ROOT) -> list[PortReading]:
    """Every port under `root`, sorted by (device, port). A device without ports/ or a port number sysfs would never
    write is skipped; past MAX_PORTS the rest are dropped rather than making the whole sample invalid."""
    ports = []
    for device in sorted(_listdir(root)):
        if not 0 < len(device) <= ID_MAX:
            continue
        names = _listdir(os.path.join(root, device, "ports"))
        numbers = sorted(int(n) for n in names if n.isascii() and n.isdigit() and int(n) <= 255)
        ports.extend(_port(root, device, n) for n in numbers)
    return ports[:MAX_PORTS]


class InfinibandCollector:
    """Samples every RDMA port of the host. Supported when `root` holds at least one device with a ports/ directory."""

    name = "infiniband"

    def __init__(self, root: str = DEFAULT_ROOT, *, host: str, rack: str = "", cluster: str = "",
                 job: str | None = None, clock: Callable[[], float] = time.time):
        self.root = root
        self.host, self.rack, self.cluster, self.job = host, rack, cluster, job
        self.clock = clock
        self.seq = 0
        self.unsupported_reason: str | None = None

    def is_supported(self) -> bool:
        """Checked afresh each call: a module loaded after the agent started makes the devices appear."""
        devices = sorted(_listdir(self.root))
        if not devices:
            self.unsupported_reason = (f"no RDMA devices under {self.root} (no InfiniBand/RoCE NIC, or the mlx5_ib / "
                                       "ib_core modules are not loaded)")
        elif not any(os.path.isdir(os.path.join(self.root, d, "ports")) for d in devices):
            self.unsupported_reason = f"no RDMA device under {self.root} has a ports/ directory ({', '.join(devices)})"
        else:
            self.unsupported_reason = None
        return self.unsupported_reason is None

    def sample(self) -> NetSample:
        """One reading of every port; a host whose devices went away gives a sample with no ports."""
        sample = NetSample(host=self.host, rack=self.rack, cluster=self.cluster, job=self.job, ts=self.clock(),
                           seq=self.seq, source="sysfs", ports=read_ports(self.root))
        self.seq += 1
        return sample

    def close(self) -> None:
        """Nothing is held open between samples: each file is opened and closed as it is read."""
