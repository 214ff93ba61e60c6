"""NVML collectors (telemetry poll and XID events), the injected NVML seam, and a fake NVML built from readings."""

from agents.nvml.collector import DeviceFault, NvmlCollector, NvmlPoll
from agents.nvml.lib import Nvml, NvmlUnavailableError, load_pynvml, normalize_pci_bus_id
from agents.nvml.xid import NvmlXidCollector

__all__ = ["DeviceFault", "Nvml", "NvmlCollector", "NvmlPoll", "NvmlUnavailableError", "NvmlXidCollector",
           "load_pynvml", "normalize_pci_bus_id"]
