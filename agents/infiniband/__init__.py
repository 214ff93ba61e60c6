"""InfiniBand / RoCE port collector: state, rate and port counters of every RDMA port, from sysfs."""

from agents.infiniband.collector import InfinibandCollector, read_ports

__all__ = ["InfinibandCollector", "read_ports"]
