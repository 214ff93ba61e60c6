"""Kernel-log collector: XID/SXid lines from /dev/kmsg, journald or a file, as XidEvents, and the host's NIC, disk,
filesystem and machine-check lines as HostEvents."""

from agents.kernel_log.collector import KernelLogCollector, StaticSource, default_sources, nvml_gpu_map
from agents.kernel_log.host_lines import ParsedHost, parse_host_line
from agents.kernel_log.lines import ParsedXid, normalize_pci, parse_line
from agents.kernel_log.parser import Detection, KernelLogParser
from agents.kernel_log.sources import FileSource, JournaldSource, KmsgSource, Record

__all__ = ["Detection", "FileSource", "JournaldSource", "KernelLogCollector", "KernelLogParser", "KmsgSource",
           "ParsedHost", "ParsedXid", "Record", "StaticSource", "default_sources", "normalize_pci", "nvml_gpu_map",
           "parse_host_line", "parse_line"]
