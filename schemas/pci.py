"""The one spelling of a PCI bus id on the wire, so kernel-log lines, NVML and samples name a GPU alike."""

from __future__ import annotations


def normalize_pci(text: str) -> str:
    """Any PCI id the driver or NVML prints ('0000:2b:00', '00000000:2B:00.0', '19:01:00.3') -> '0000:2b:00.0'."""
    body, _, function = text.strip().partition(".")
    parts = body.split(":")
    domain = int(parts[-3], 16) if len(parts) >= 3 else 0
    return f"{domain:04x}:{int(parts[-2], 16):02x}:{int(parts[-1], 16):02x}.{int(function or '0', 16):x}"
