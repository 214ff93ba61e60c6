"""Network port sample: one message per host per interval, carrying every InfiniBand / RoCE port of the host as
sysfs shows it (/sys/class/infiniband/<device>/ports/<port>/: state, phys_state, rate and the port counters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.columns import ch
from schemas.events import LC, LC_NULL, HostRecord
from schemas.limits import ID_MAX

MAX_PORTS = 64  # a GPU host has one HCA port per GPU plus a few for storage and management
_COUNTER = ch("UInt64", "Delta, ZSTD(1)")  # cumulative: the deltas are mostly zero
# The IB port counters (IBTA PortCounters, sysfs ports/<n>/counters/<name>) fleetpulse reads, file name = field name.
# Errors of the physical link (symbol_error, link_error_recovery, link_downed, local_link_integrity_errors) say the
# cable, transceiver or switch port is bad; receive/transmit errors and discards say packets were lost or dropped.
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                  "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "VL15_dropped")
TRAFFIC_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait")
COUNTERS = ERROR_COUNTERS + TRAFFIC_COUNTERS


class PortReading(BaseModel):
    """One port of one RDMA device at sample time. A file the host cannot read is None, never a made-up zero."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field(min_length=1, max_length=ID_MAX, json_schema_extra=LC, description="mlx5_0, ...")
    port: int = Field(ge=0, le=255, json_schema_extra=ch("UInt8"))
    pci_bus_id: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                                   description="the device's PCI address (its sysfs `device` link), as mlx5 lines name it")
    netdev: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                               description="the port's network interface (RoCE, IPoIB), where it has one")
    link_layer: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                                   description="InfiniBand or Ethernet (RoCE)")
    state: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                              description="logical state: DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER")
    phys_state: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                                   description="physical state: Sleep, Polling, Disabled, PortConfigurationTraining, "
                                               "LinkUp, LinkErrorRecovery, Phy Test")
    rate_gbps: float | None = Field(default=None, ge=0, le=100000,
                                    description="the link's rate now (sysfs `rate`, e.g. '400 Gb/sec (4X NDR)')")
    rate: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                             description="the `rate` file as read, width and speed included")
    symbol_error: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    link_error_recovery: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    link_downed: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_rcv_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_rcv_remote_physical_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_rcv_switch_relay_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_xmit_discards: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_xmit_constraint_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_rcv_constraint_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    local_link_integrity_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    excessive_buffer_overrun_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    VL15_dropped: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_xmit_data: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER,
                                       description="octets divided by 4, as the IB counter counts")
    port_rcv_data: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER,
                                      description="octets divided by 4, as the IB counter counts")
    port_xmit_packets: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_rcv_packets: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    port_xmit_wait: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)


def unique_ports(s: Mapping[str, Any]) -> str | None:
    """One reading per (device, port) in a sample: the rules keep each port's memory by that key."""
    keys = [(p["device"], p["port"]) for p in s["ports"]]
    if len(set(keys)) != len(keys):
        twice = sorted({f"{d}/{n}" for d, n in keys if keys.count((d, n)) > 1})
        return f"port {', '.join(twice)[:200]} read more than once in one sample"
    return None


class NetSample(HostRecord):
    """Every RDMA port of one host at one time (`fleetpulse agent` collector `infiniband`, or the simulator)."""

    seq: int = Field(ge=0, description="per-agent sequence number of this collector", json_schema_extra=ch("UInt64"))
    source: Literal["sysfs", "simulator"] = "sysfs"
    ports: list[PortReading] = Field(default_factory=list, max_length=MAX_PORTS)

    lean_checks: ClassVar[tuple] = (unique_ports,)  # cross-field rules, shared with schemas/validate.py

    @model_validator(mode="after")
    def _cross_fields(self) -> NetSample:
        for check in self.lean_checks:
            if (reason := check({"ports": [{"device": p.device, "port": p.port} for p in self.ports]})) is not None:
                raise ValueError(reason)
        return self
