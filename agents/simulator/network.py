"""Every simulated host's InfiniBand ports, as the infiniband collector reads them from sysfs: one ConnectX-7 NDR
port per GPU (mlx5_0..mlx5_7, port 1), ACTIVE at 400 Gb/s, with the counters a fault moves (NetSample dicts)."""

from __future__ import annotations

import numpy as np

from agents.simulator.fleet import Fleet

NET_EVERY_S = 30.0  # simulated seconds between one host's port samples (the infiniband collector's cadence here)
PORTS_PER_HOST = 8
NDR_GBPS = 400.0
RATE_TEXT = {400.0: "400 Gb/sec (4X NDR)", 200.0: "200 Gb/sec (2X NDR)", 100.0: "100 Gb/sec (1X NDR)",
             10.0: "10 Gb/sec (4X SDR)"}
DOWN_GBPS = 10.0  # what sysfs shows for a port whose link is down
# PCI addresses of the eight compute NICs of an HGX H100 host (one beside each GPU's PCIe switch).
NIC_PCI = ("0000:1a:00.0", "0000:2b:00.0", "0000:3c:00.0", "0000:4d:00.0", "0000:9c:00.0", "0000:ad:00.0",
           "0000:be:00.0", "0000:cf:00.0")
WORDS_PER_S = 400e9 / 8 / 4 * 0.35  # port_xmit_data counts 4-octet words; a training job keeps a link ~35 % busy


def rate_text(gbps: float) -> str:
    return RATE_TEXT.get(gbps, f"{gbps:g} Gb/sec (4X)")


class NetState:
    """All hosts' ports as arrays of shape (hosts, 8); `advance` applies one tick of fault effects."""

    def __init__(self, fleet: Fleet):
        shape = (fleet.n_hosts, PORTS_PER_HOST)
        self.fleet = fleet
        self.down = np.zeros(shape, dtype=bool)
        self.rate = np.full(shape, NDR_GBPS)
        self.link_downed = np.zeros(shape, dtype=np.int64)
        self.link_error_recovery = np.zeros(shape, dtype=np.int64)
        self.symbol_error = np.zeros(shape, dtype=np.int64)
        self.port_rcv_errors = np.zeros(shape, dtype=np.int64)  # stays 0: a flapping link's errors are symbol errors
        self.errors = np.zeros(shape)  # symbol errors added, unrounded
        self.data = np.zeros(shape, dtype=np.int64)
        self.busy = np.repeat(fleet.gpu_job.reshape(fleet.n_hosts, -1)[:, :1] >= 0, PORTS_PER_HOST, axis=1)

    def advance(self, dt: float, down: np.ndarray, rate: np.ndarray, drops: np.ndarray, errors: np.ndarray) -> None:
        """One tick: ports `down` now, `rate` (NaN = full) while up, `drops` links lost and retrained since the last
        tick (each counts link_downed and a link error recovery), `errors` physical-layer errors added."""
        self.link_downed += drops + (down & ~self.down)  # a link going down counts once, when it goes
        self.link_error_recovery += drops
        self.errors += errors  # no noise: the ground truth (truth.py) counts exactly what the rule will see
        self.symbol_error = np.floor(self.errors).astype(np.int64)
        self.down = down.copy()
        self.rate = np.where(down, DOWN_GBPS, np.where(np.isnan(rate), NDR_GBPS, rate))
        self.data += np.where(down | ~self.busy, 0, (WORDS_PER_S * dt * self.rate / NDR_GBPS).astype(np.int64))

    def rebooted(self, host: int) -> None:
        """A reboot sets the host's port counters back to zero, as the HCA driver's reload does."""
        for counter in (self.link_downed, self.link_error_recovery, self.symbol_error, self.port_rcv_errors,
                        self.errors, self.data):
            counter[host] = 0

    def samples(self, *, ts: float, seq: int, up: np.ndarray) -> list[dict]:
        """One NetSample dict per host that is up. Only the fields the simulation moves are filled; the rest are
        None, as for a file the collector could not read."""
        f, out = self.fleet, []
        for h in np.flatnonzero(up).tolist():
            ports = []
            for p in range(PORTS_PER_HOST):
                down, rate = bool(self.down[h, p]), float(self.rate[h, p])
                ports.append({
                    "device": f"mlx5_{p}", "port": 1, "pci_bus_id": NIC_PCI[p], "link_layer": "InfiniBand",
                    "state": "DOWN" if down else "ACTIVE", "phys_state": "Polling" if down else "LinkUp",
                    "rate_gbps": rate, "rate": rate_text(rate), "symbol_error": int(self.symbol_error[h, p]),
                    "link_error_recovery": int(self.link_error_recovery[h, p]),
                    "link_downed": int(self.link_downed[h, p]), "port_rcv_errors": int(self.port_rcv_errors[h, p]),
                    "port_xmit_data": int(self.data[h, p]), "port_rcv_data": int(self.data[h, p])})
            out.append({"host": f.hosts[h], "rack": f.racks[h], "cluster": f.cluster, "job": f.job_name_of_host(h),
                        "ts": ts, "seq": seq, "source": "simulator", "ports": ports})
        return out
