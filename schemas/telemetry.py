"""Host telemetry sample: one message per host per interval, carrying every GPU of the host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.columns import ch
from schemas.limits import GPU_INDEX_MAX, ID_MAX, MAX_GPUS, NAME_MAX

SCHEMA_VERSION = 1


class GpuReading(BaseModel):
    """One GPU's counters at sample time. A field the host cannot read is None, never a made-up zero."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, le=GPU_INDEX_MAX, json_schema_extra=ch("UInt8"))
    uuid: str = Field(min_length=1, max_length=ID_MAX)
    pci_bus_id: str = Field(min_length=1, max_length=ID_MAX, json_schema_extra=ch("LowCardinality(String)"))
    model: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=ch("LowCardinality(Nullable(String))"))
    # utilisation
    gpu_util_pct: float | None = Field(default=None, ge=0, le=100)
    mem_util_pct: float | None = Field(default=None, ge=0, le=100)
    sm_active: float | None = Field(default=None, ge=0, le=1, description="DCGM PROF_SM_ACTIVE ratio")
    tensor_active: float | None = Field(default=None, ge=0, le=1, description="DCGM PROF_PIPE_TENSOR_ACTIVE ratio")
    mem_used_mib: float | None = Field(default=None, ge=0)
    mem_total_mib: float | None = Field(default=None, ge=0)
    # clocks, temperatures, power
    sm_clock_mhz: float | None = Field(default=None, ge=0)
    mem_clock_mhz: float | None = Field(default=None, ge=0)
    gpu_temp_c: float | None = None
    hbm_temp_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    power_limit_w: float | None = Field(default=None, ge=0, description="enforced power limit")
    energy_mj: int | None = Field(default=None, ge=0, description="energy since driver load, mJ")
    throttle_reasons: int | None = Field(default=None, ge=0, description="NVML clocks-event reason bitmask")
    throttle_power_ns: int | None = Field(default=None, ge=0, description="cumulative time clocks were held by power")
    throttle_thermal_ns: int | None = Field(default=None, ge=0, description="cumulative time held by thermal limits")
    # device limits (read once by collectors, repeated here so every sample is self-describing)
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    gpu_max_op_temp_c: float | None = None
    hbm_max_op_temp_c: float | None = None
    # memory errors
    ecc_sbe_volatile: int | None = Field(default=None, ge=0)
    ecc_dbe_volatile: int | None = Field(default=None, ge=0)
    ecc_sbe_aggregate: int | None = Field(default=None, ge=0)
    ecc_dbe_aggregate: int | None = Field(default=None, ge=0)
    retired_pages_sbe: int | None = Field(default=None, ge=0)
    retired_pages_dbe: int | None = Field(default=None, ge=0)
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = Field(default=None, ge=0)
    remapped_rows_uncorrectable: int | None = Field(default=None, ge=0)
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    # interconnect
    pcie_replay_count: int | None = Field(default=None, ge=0)
    nvlink_crc_errors: int | None = Field(default=None, ge=0, description="CRC flit+data errors, all links")
    nvlink_replay_errors: int | None = Field(default=None, ge=0)
    nvlink_recovery_errors: int | None = Field(default=None, ge=0)
    # fault state
    last_xid: int | None = Field(default=None, ge=0)
    recovery_action: int | None = Field(default=None, ge=0, le=7, description="nvmlDeviceGpuRecoveryAction_t")
    mig_enabled: bool | None = Field(default=None, description="MIG mode (per-instance metrics are not in this row)")
    unsupported: list[str] = Field(default_factory=list, max_length=64, description="fields this GPU cannot report")


def unique_gpu_indices(s: Mapping[str, Any]) -> str | None:
    """A GPU appears once per sample: two readings for one index would be two rows with one key, and the rules
    would take the second for the first GPU's next reading."""
    seen: set[int] = set()
    for g in s["gpus"]:
        if g["index"] in seen:
            return f"gpus: index {g['index']} appears twice"
        seen.add(g["index"])
    return None


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
    seq: int = Field(ge=0, description="per-host sample sequence number", json_schema_extra=ch("UInt64"))
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
