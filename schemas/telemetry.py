"""Host telemetry sample: one message per host per interval, carrying every GPU of the host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.columns import ch
from schemas.limits import GPU_INDEX_MAX, ID_MAX, MAX_GPUS, NAME_MAX

SCHEMA_VERSION = 1


# How gpu_samples stores each counter (docs/storage.md): at the resolution its source reports, in the narrowest type,
# with the codec that suits how it moves. A number finer than its resolution is rounded to it.
WHOLE = "whole units (NVML's resolution)"
PER_MILLE = "resolution 0.001"
MILLIWATTS = "resolution 1 mW (NVML's)"
_PERCENT = ch("UInt8", "ZSTD(1)")
_MHZ = ch("UInt16", "ZSTD(1)")
_CELSIUS = ch("Int16", "ZSTD(1)")
_EXACT = ch("Float64", "ZSTD(1)")  # MiB from NVML's bytes: kept exactly (Gorilla only grows noisy gauges)
_COUNTER = ch("UInt64", "Delta, ZSTD(1)")  # cumulative: the deltas are mostly zero
_FLAG = ch("Bool", "ZSTD(1)")
_SMALL = ch("UInt8", "ZSTD(1)")  # a small level that rarely moves (a link's generation or width, a state)
_BANKS = ch("UInt16", "ZSTD(1)")
# GPU fabric (NVLink domain) status, in DCGM's dcgmFabricManagerStatus_t numbering (DCGM_FI_DEV_FABRIC_MANAGER_STATUS);
# the NVML collector derives it from nvmlGpuFabricInfo's state and status as DCGM does.
FABRIC_STATUS = {0: "not supported", 1: "not started", 2: "in progress", 3: "success", 4: "failure",
                 5: "unrecognized", 6: "NVML too old"}
FABRIC_SUCCESS, FABRIC_FAILURE = 3, 4


def _ratio(stored_as: str) -> dict:
    return ch("UInt16", "T64, ZSTD(1)", scale=1000, stored_as=stored_as)


class GpuReading(BaseModel):
    """One GPU's counters at sample time. A field the host cannot read is None, never a made-up zero."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, le=GPU_INDEX_MAX, json_schema_extra=ch("UInt8"))
    uuid: str = Field(min_length=1, max_length=ID_MAX, json_schema_extra=ch("LowCardinality(String)"))
    pci_bus_id: str = Field(min_length=1, max_length=ID_MAX, json_schema_extra=ch("LowCardinality(String)"))
    model: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=ch("LowCardinality(Nullable(String))"))
    # utilisation
    gpu_util_pct: float | None = Field(default=None, ge=0, le=100, description=WHOLE, json_schema_extra=_PERCENT)
    mem_util_pct: float | None = Field(default=None, ge=0, le=100, description=WHOLE, json_schema_extra=_PERCENT)
    sm_active: float | None = Field(default=None, ge=0, le=1, description=f"DCGM PROF_SM_ACTIVE ratio; {PER_MILLE}",
                                    json_schema_extra=_ratio("sm_active_permille"))
    tensor_active: float | None = Field(default=None, ge=0, le=1, description=f"DCGM PROF_PIPE_TENSOR_ACTIVE ratio; "
                                        f"{PER_MILLE}", json_schema_extra=_ratio("tensor_active_permille"))
    mem_used_mib: float | None = Field(default=None, ge=0, json_schema_extra=_EXACT)
    mem_total_mib: float | None = Field(default=None, ge=0, json_schema_extra=_EXACT)
    # clocks, temperatures, power
    sm_clock_mhz: float | None = Field(default=None, ge=0, description=WHOLE, json_schema_extra=_MHZ)
    mem_clock_mhz: float | None = Field(default=None, ge=0, description=WHOLE, json_schema_extra=_MHZ)
    gpu_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    hbm_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    power_w: float | None = Field(default=None, ge=0, description=MILLIWATTS,
                                  json_schema_extra=ch("UInt32", "T64, ZSTD(1)", scale=1000, stored_as="power_mw"))
    power_limit_w: float | None = Field(default=None, ge=0, description=f"enforced power limit; {MILLIWATTS}",
                                        json_schema_extra=ch("UInt32", "ZSTD(1)", scale=1000,
                                                             stored_as="power_limit_mw"))
    power_default_limit_w: float | None = Field(
        default=None, ge=0, description=f"the board's default power limit (a device limit); {MILLIWATTS}",
        json_schema_extra=ch("UInt32", "ZSTD(1)", scale=1000, stored_as="power_default_limit_mw"))
    energy_mj: int | None = Field(default=None, ge=0, description="energy since driver load, mJ",
                                  json_schema_extra=ch("UInt64", "Delta, T64, ZSTD(1)"))
    throttle_reasons: int | None = Field(default=None, ge=0, description="NVML clocks-event reason bitmask",
                                         json_schema_extra=ch("UInt64", "ZSTD(1)"))
    throttle_power_ns: int | None = Field(default=None, ge=0, description="cumulative time clocks were held by power",
                                          json_schema_extra=_COUNTER)
    throttle_thermal_ns: int | None = Field(default=None, ge=0, description="cumulative time held by thermal limits",
                                            json_schema_extra=_COUNTER)
    # device limits (read once by collectors, repeated here so every sample is self-describing)
    slowdown_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    shutdown_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    gpu_max_op_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    hbm_max_op_temp_c: float | None = Field(default=None, description=WHOLE, json_schema_extra=_CELSIUS)
    # memory errors
    ecc_sbe_volatile: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    ecc_dbe_volatile: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    ecc_sbe_aggregate: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    ecc_dbe_aggregate: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    retired_pages_sbe: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    retired_pages_dbe: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    retired_pages_pending: bool | None = Field(default=None, json_schema_extra=_FLAG)
    remapped_rows_correctable: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    remapped_rows_uncorrectable: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    row_remap_pending: bool | None = Field(default=None, json_schema_extra=_FLAG)
    row_remap_failure: bool | None = Field(default=None, json_schema_extra=_FLAG)
    # NVML's row remapper histogram: memory banks by how many spare rows they have left
    remap_banks_max: int | None = Field(default=None, ge=0, le=65535, description="banks with every spare row left",
                                        json_schema_extra=_BANKS)
    remap_banks_high: int | None = Field(default=None, ge=0, le=65535, description="banks with most spare rows left",
                                         json_schema_extra=_BANKS)
    remap_banks_partial: int | None = Field(default=None, ge=0, le=65535, description="banks with some spare rows "
                                            "left", json_schema_extra=_BANKS)
    remap_banks_low: int | None = Field(default=None, ge=0, le=65535, description="banks with few spare rows left",
                                        json_schema_extra=_BANKS)
    remap_banks_none: int | None = Field(default=None, ge=0, le=65535, description="banks with no spare row left: the "
                                         "next bad row there cannot be remapped", json_schema_extra=_BANKS)
    # interconnect
    pcie_replay_count: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    pcie_link_gen: int | None = Field(default=None, ge=0, le=255, description="PCIe link generation now (an idle GPU "
                                      "may train down to save power)", json_schema_extra=_SMALL)
    pcie_link_gen_max: int | None = Field(default=None, ge=0, le=255, description="the highest PCIe generation the "
                                          "GPU and its slot allow", json_schema_extra=_SMALL)
    pcie_link_width: int | None = Field(default=None, ge=0, le=255, description="PCIe lanes in use now",
                                        json_schema_extra=_SMALL)
    pcie_link_width_max: int | None = Field(default=None, ge=0, le=255, description="the most PCIe lanes the GPU and "
                                            "its slot allow", json_schema_extra=_SMALL)
    nvlink_crc_errors: int | None = Field(default=None, ge=0, description="CRC flit+data errors, all links",
                                          json_schema_extra=_COUNTER)
    nvlink_replay_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    nvlink_recovery_errors: int | None = Field(default=None, ge=0, json_schema_extra=_COUNTER)
    nvlink_links: int | None = Field(default=None, ge=0, le=32, description="NVLink links the GPU has (each answers "
                                     "a state query, active or not)", json_schema_extra=_SMALL)
    nvlink_active_mask: int | None = Field(default=None, ge=0, le=2**32 - 1, description="bit i set: link i is "
                                           "active now", json_schema_extra=ch("UInt32", "ZSTD(1)"))
    # the GPU's NVLink domain (NVSwitch fabric): nvmlDeviceGetGpuFabricInfo, DCGM fields 170-174
    fabric_status: int | None = Field(default=None, ge=0, le=6, description="fabric manager status: 0 not supported, "
                                      "1 not started, 2 in progress, 3 success, 4 failure, 5 unrecognized, 6 NVML too "
                                      "old (DCGM's numbering)", json_schema_extra=_SMALL)
    fabric_clique_id: int | None = Field(default=None, ge=0, le=2**32 - 1, description="the GPU's NVLink clique "
                                         "(domain) within the fabric", json_schema_extra=ch("UInt32", "ZSTD(1)"))
    fabric_cluster_uuid: str | None = Field(default=None, max_length=ID_MAX, description="the fabric's cluster UUID",
                                            json_schema_extra=ch("LowCardinality(Nullable(String))"))
    fabric_health_mask: int | None = Field(default=None, ge=0, le=2**32 - 1, description="NVML fabric health mask "
                                           "(degraded bandwidth, route recovery, route unhealthy, access timeout, "
                                           "configuration, partition, fabric manager connection)",
                                           json_schema_extra=ch("UInt32", "ZSTD(1)"))
    # fault state
    last_xid: int | None = Field(default=None, ge=0, json_schema_extra=ch("UInt64", "ZSTD(1)"))
    recovery_action: int | None = Field(default=None, ge=0, le=7, description="nvmlDeviceGpuRecoveryAction_t",
                                        json_schema_extra=ch("UInt8", "ZSTD(1)"))
    mig_enabled: bool | None = Field(default=None, description="MIG mode (per-instance metrics are not in this row)",
                                     json_schema_extra=_FLAG)
    unsupported: list[str] = Field(default_factory=list, max_length=64, description="fields this GPU cannot report",
                                   json_schema_extra=ch("Array(LowCardinality(String))"))


def unique_gpu_indices(s: Mapping[str, Any]) -> str | None:
    """A GPU appears once per sample: two readings for one index would be two rows with one key, and the rules
    would take the second for the first GPU's next reading."""
    indices = [g["index"] for g in s["gpus"]]
    if len(set(indices)) == len(indices):
        return None
    twice = next(i for k, i in enumerate(indices) if i in indices[:k])
    return f"gpus: index {twice} appears twice"


class HostSample(BaseModel):
    """Every GPU of one host at one instant, with the host's placement labels."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, json_schema_extra=ch("UInt8"))
    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=ch("LowCardinality(String)"))
    rack: str = Field(default="", max_length=NAME_MAX, json_schema_extra=ch("LowCardinality(String)"))
    cluster: str = Field(default="", max_length=NAME_MAX, json_schema_extra=ch("LowCardinality(String)"))
    job: str | None = Field(default=None, max_length=NAME_MAX,
                            json_schema_extra=ch("LowCardinality(Nullable(String))"))
    ts: float = Field(gt=0, description="sample time, epoch seconds", json_schema_extra=ch("DateTime64(3, 'UTC')"))
    seq: int = Field(ge=0, description="per-host sample sequence number",
                     json_schema_extra=ch("UInt64", "DoubleDelta, ZSTD(1)"))
    source: Literal["nvml", "dcgm", "simulator"] = "nvml"
    driver_version: str | None = Field(default=None, max_length=ID_MAX,
                                       json_schema_extra=ch("LowCardinality(Nullable(String))"))
    gpus: list[GpuReading] = Field(max_length=MAX_GPUS)

    lean_checks: ClassVar[tuple] = (unique_gpu_indices,)  # cross-field rules, shared with schemas/validate.py

    @model_validator(mode="after")
    def _cross_fields(self) -> HostSample:
        for check in self.lean_checks:
            if (reason := check({"gpus": [{"index": g.index} for g in self.gpus]})) is not None:
                raise ValueError(reason)
        return self
