"""DcgmExporterCollector: scrapes a local dcgm-exporter and maps its Prometheus text onto one HostSample."""

from __future__ import annotations

import math
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agents.nvml.collector import validated_reading
from agents.nvml.lib import normalize_pci_bus_id
from core.errors import FleetpulseError
from schemas.telemetry import GpuReading, HostSample

DEFAULT_URL = "http://localhost:9400/metrics"
# DCGM blank sentinels (dcgm_structs.h): BLANK, +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED.
INT64_BLANK, INT32_BLANK, FP64_BLANK = 0x7FFFFFFFFFFFFFF0, 0x7FFFFFF0, 140737488355328.0
NOT_SUPPORTED, NOT_PERMISSIONED = 2, 3
# exporter name (old and new DCGM names) -> (GpuReading field, conversion). "small" kinds never legitimately
# reach 2**31, so the int32 blank window applies to them; counters are only checked against the 64-bit blanks.
_SMALL = {"float", "ratio", "bool", "int_small", "xid", "recovery"}
FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", "float"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", "float"),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", "ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", "ratio"),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", "float"),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total_mib", "float"),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", "float"),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", "float"),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temp_c", "float"),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("gpu_temp_c", "float"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("hbm_temp_c", "float"),
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("hbm_temp_c", "float"),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", "float"),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power_w", "float"),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", "float"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS": ("power_limit_w", "float"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": ("power_default_limit_w", "float"),  # field 163
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS": ("power_default_limit_w", "float"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", "int"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", "int_small"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", "int_small"),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("slowdown_temp_c", "float"),
    "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS": ("slowdown_temp_c", "float"),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("shutdown_temp_c", "float"),
    "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS": ("shutdown_temp_c", "float"),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": ("gpu_max_op_temp_c", "float"),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP_CELSIUS": ("gpu_max_op_temp_c", "float"),
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": ("hbm_max_op_temp_c", "float"),
    "DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS": ("hbm_max_op_temp_c", "float"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile", "int"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", "int"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_sbe_aggregate", "int"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_dbe_aggregate", "int"),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", "int"),
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": ("retired_pages_sbe", "int"),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", "int"),
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": ("retired_pages_dbe", "int"),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", "bool"),
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": ("retired_pages_pending", "bool"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", "int"),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("remapped_rows_correctable", "int"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", "int"),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("remapped_rows_uncorrectable", "int"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("row_remap_pending", "bool"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row_remap_failure", "bool"),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("row_remap_failure", "bool"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_count", "int"),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("pcie_replay_count", "int"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", "int"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": ("nvlink_crc_errors", "int"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", "int"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": ("nvlink_crc_errors", "int"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_replay_errors", "int"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": ("nvlink_replay_errors", "int"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("nvlink_recovery_errors", "int"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": ("nvlink_recovery_errors", "int"),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_link_gen", "int_small"),  # fields 235-238
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("pcie_link_gen_max", "int_small"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_link_width", "int_small"),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("pcie_link_width_max", "int_small"),
    **{f"DCGM_FI_DEV_{name}_{level.upper()}": (f"remap_banks_{level}", "int_small")  # fields 385-389, both names
       for name in ("BANKS_REMAP_ROWS_AVAIL", "BANK_REMAP_AVAIL")
       for level in ("max", "high", "partial", "low", "none")},
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": ("fabric_status", "int_small"),  # fields 170, 173, 174 (172, the cluster
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID": ("fabric_clique_id", "int"),  # UUID, is a string: no metric carries it)
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK": ("fabric_health_mask", "int_small"),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", "xid"),
    "DCGM_FI_DEV_XID_ERROR": ("last_xid", "xid"),
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": ("recovery_action", "recovery"),
}
SUMMED = {"nvlink_crc_errors"}  # CRC = flit + data, exported as two metrics
POD_LABELS = ("namespace", "pod", "container")
_PER_INSTANCE = ("DCGM_FI_PROF_", "DCGM_FI_DEV_FB_", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL")


class ExporterUnavailableError(FleetpulseError):
    """The local dcgm-exporter endpoint did not answer."""

    retryable = True


@dataclass
class DcgmScrape:
    """One scrape: the sample plus what the schema has no column for yet, keyed by GPU UUID."""

    sample: HostSample
    pods: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # namespace/pod/container[/gpu_instance]
    mig: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # uuid -> GPU_I_ID -> metric -> value
    other: dict[str, dict[str, float]] = field(default_factory=dict)  # uuid -> unmapped metric -> value
    skipped: Counter[str] = field(default_factory=Counter)  # bad_line, blank, no_gpu_label, invalid:<field>


def _samples(text: str, skipped: Counter[str]):
    """(name, labels, value) of every sample; one malformed line costs that line, not the scrape."""
    try:
        yield from [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
        return
    except Exception:  # the parser raises ValueError and friends on foreign text; fall back line by line
        pass
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            for f in text_string_to_metric_families(line + "\n"):
                yield from [(s.name, s.labels, s.value) for s in f.samples]
        except Exception:
            skipped["bad_line"] += 1


def _blank(value: int | float, kind: str) -> int | None:
    """None for a real value, else the sentinel's offset from its blank base (2 = NOT_SUPPORTED, 3 = NO_PERMISSION)."""
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    for base in (INT64_BLANK, FP64_BLANK) + ((INT32_BLANK,) if kind in _SMALL else ()):
        if value >= base:
            offset = value - base  # exact for integers: the parser keeps integer text as int
            return int(offset) if offset < 16 else 0
    return None


def _convert(value: float, kind: str):
    if kind in ("float", "ratio"):
        return float(value)
    if kind == "bool":
        return bool(value)
    number = int(round(value))
    if kind == "xid":
        return number or None  # 0 = no XID since the exporter started
    return number


def parse_exporter_text(text: str, *, host: str, ts: float, seq: int = 0, rack: str = "",
                        cluster: str = "") -> DcgmScrape:
    """Map dcgm-exporter text onto a HostSample (source 'dcgm'); never raises on malformed text."""
    skipped: Counter[str] = Counter()
    readings: dict[str, dict] = {}
    pods: dict[str, list[dict[str, str]]] = defaultdict(list)
    mig: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    other: dict[str, dict[str, float]] = defaultdict(dict)
    driver: str | None = None
    seen: set[tuple[str, str | None, str]] = set()
    for name, labels, value in _samples(text, skipped):
        name = name[:-6] if name.endswith("_total") else name
        gpu, uuid = labels.get("gpu", ""), labels.get("UUID", "")
        if not name.startswith("DCGM_"):
            skipped["not_dcgm"] += 1
            continue
        if not (gpu.isdecimal() and int(gpu) <= 255 and uuid):
            skipped["no_gpu_label"] += 1
            continue
        r = readings.get(uuid)
        if r is None:
            pci = labels.get("pci_bus_id") or labels.get("DCGM_FI_DEV_PCI_BUSID") or "unknown"
            r = readings[uuid] = {"index": int(gpu), "uuid": uuid, "pci_bus_id": normalize_pci_bus_id(pci),
                                  "model": labels.get("modelName") or labels.get("DCGM_FI_DEV_NAME"),
                                  "unsupported": []}
        driver = driver or labels.get("DCGM_FI_DRIVER_VERSION")
        instance = labels.get("GPU_I_ID")
        pod = {k: labels[k] for k in POD_LABELS if labels.get(k)}
        if pod:
            if instance:
                pod["gpu_instance"] = instance
            if pod not in pods[uuid]:
                pods[uuid].append(pod)
        if (uuid, instance, name) in seen:
            continue  # the same series again with other pod labels (a shared GPU): same value, count once
        seen.add((uuid, instance, name))
        target, kind = FIELDS.get(name, (None, "float"))
        blank = _blank(value, kind)
        if blank is not None:
            skipped["blank"] += 1
            if target and blank in (NOT_SUPPORTED, NOT_PERMISSIONED) and target not in r["unsupported"]:
                r["unsupported"].append(target)
            continue
        if instance and name.startswith(_PER_INSTANCE):
            mig[uuid][instance][name] = float(value)  # per MIG instance: no GPU-wide value to derive
        elif target is None:
            other[uuid][name] = float(value)
        elif target in SUMMED and target in r and not instance:
            r[target] += _convert(value, kind)
        elif target not in r or not instance:
            r[target] = _convert(value, kind)  # device rows win over MIG-instance copies of device values
    for uuid, r in readings.items():
        o = other.get(uuid, {})
        if r.get("mem_total_mib") is None and "mem_used_mib" in r and "DCGM_FI_DEV_FB_FREE" in o:
            r["mem_total_mib"] = r["mem_used_mib"] + o["DCGM_FI_DEV_FB_FREE"] + o.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
    invalid: Counter[str] = Counter()
    gpus: list[GpuReading] = []
    for r in readings.values():
        try:
            gpus.append(validated_reading(r, invalid))
        except ValidationError:  # an identity field the schema refuses: drop the GPU, count it
            skipped["invalid_gpu"] += 1
    skipped.update({f"invalid:{k}": v for k, v in invalid.items()})
    unique: dict[int, GpuReading] = {}
    for g in sorted(gpus, key=lambda g: (g.index, g.uuid)):  # one host has one GPU per index: a text that shows two
        if g.index in unique:  # (scrapes of several hosts run together) keeps the first, counted, never both
            skipped["duplicate_index"] += 1
        else:
            unique[g.index] = g
    sample = HostSample(host=host, rack=rack, cluster=cluster, ts=ts, seq=seq, source="dcgm", driver_version=driver,
                        gpus=list(unique.values()))
    return DcgmScrape(sample, dict(pods), {u: dict(m) for u, m in mig.items()}, dict(other), skipped)


def _http_get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (a configured local URL)
        return response.read().decode("utf-8", errors="replace")


class DcgmExporterCollector:
    """Scrapes dcgm-exporter (default http://localhost:9400/metrics); `fetch(url) -> text` is injectable."""

    name = "dcgm"

    def __init__(self, *, host: str, url: str = DEFAULT_URL, fetch: Callable[[str], str] | None = None,
                 rack: str = "", cluster: str = "", clock: Callable[[], float] = time.time, timeout_s: float = 2.0):
        self.host, self.url, self.rack, self.cluster, self.clock = host, url, rack, cluster, clock
        self.fetch = fetch or (lambda u: _http_get(u, timeout_s))
        self.seq = 0
        self.unsupported_reason: str | None = None

    def _text(self) -> str:
        try:
            return self.fetch(self.url)
        except OSError as exc:  # connection refused, timeout, HTTP error (urllib's errors are OSErrors)
            raise ExporterUnavailableError(f"{self.url}: {exc}") from exc

    def is_supported(self) -> bool:
        """True when the endpoint answers with at least one GPU's DCGM metrics."""
        try:
            scrape = parse_exporter_text(self._text(), host=self.host, ts=self.clock())
        except ExporterUnavailableError as exc:
            self.unsupported_reason = str(exc)
            return False
        self.unsupported_reason = None if scrape.sample.gpus else f"{self.url}: no DCGM GPU metrics"
        return self.unsupported_reason is None

    def sample(self) -> DcgmScrape:
        scrape = parse_exporter_text(self._text(), host=self.host, ts=self.clock(), seq=self.seq, rack=self.rack,
                                     cluster=self.cluster)
        self.seq += 1
        return scrape

    def close(self) -> None:
        """Nothing held open between scrapes."""
