"""Raw events from hosts besides the periodic sample: kernel-log XIDs and per-rank NCCL timings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.columns import ch

TS = ch("DateTime64(3, 'UTC')")
LC = ch("LowCardinality(String)")
LC_NULL = ch("LowCardinality(Nullable(String))")
UINT32_MAX = 2**32 - 1


class XidEvent(BaseModel):
    """One XID or SXid line (or NVML XID event) as read on a host."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, json_schema_extra=LC)
    rack: str = Field(default="", json_schema_extra=LC)
    cluster: str = Field(default="", json_schema_extra=LC)
    ts: float = Field(gt=0, json_schema_extra=TS)
    kind: Literal["xid", "sxid"] = "xid"
    code: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    pci_bus_id: str | None = Field(default=None, json_schema_extra=LC_NULL)
    gpu_index: int | None = Field(default=None, ge=0)
    gpu_uuid: str | None = None
    gpu_instance: int | None = Field(default=None, ge=0, description="MIG GPU instance id (GPU-I:)")
    pid: int | None = None
    process: str | None = None
    severity: str | None = Field(default=None, description="Fatal / Nonfatal where the line carries it (NVLink5, SXid)")
    caused_by: int | None = Field(default=None, description="'caused by previous Xid N' suffix")
    recovery_action: int | None = Field(default=None, ge=0, le=7, description="Xid 154: the new recovery action")
    unit: str | None = Field(default=None, description="NVLink5 unit (e.g. RLW_RXPIPE) where the line names one")
    link: int | None = Field(default=None, description="NVLink link number where the line names one")
    count: int = Field(default=1, ge=1, description="exact repeats folded into this event by the collector")
    message: str = ""
    raw_line: str = ""
    source: Literal["kmsg", "journald", "file", "nvml", "dcgm", "simulator"] = "kmsg"


def rank_in_world(t: Mapping[str, Any]) -> str | None:
    """A rank numbers one member of its communicator: 0 <= rank < world_size."""
    if t["rank"] >= t["world_size"]:
        return f"rank {t['rank']} is not below world_size {t['world_size']}"
    return None


class NcclTiming(BaseModel):
    """One rank's timing around one collective: compute before it, and time inside it."""

    model_config = ConfigDict(extra="forbid")

    job: str = Field(min_length=1, json_schema_extra=LC)
    rank: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    world_size: int = Field(ge=1, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    host: str = Field(min_length=1, json_schema_extra=LC)
    gpu_index: int | None = Field(default=None, ge=0)
    collective: str = Field(json_schema_extra=LC, description="AllReduce, AllGather, ReduceScatter, ...")
    seq: int = Field(ge=0, description="collective sequence number within the job's communicator")
    bytes: int = Field(ge=0)
    ts: float = Field(gt=0, json_schema_extra=TS, description="collective start on this rank, epoch seconds")
    compute_us: float = Field(ge=0, description="compute time since this rank's previous collective")
    collective_us: float = Field(ge=0, description="time inside the collective, waiting included")
    source: Literal["inspector", "api", "nccl-tests", "simulator"] = "api"

    lean_checks: ClassVar[tuple] = (rank_in_world,)  # cross-field rules, shared with schemas/validate.py

    @model_validator(mode="after")
    def _cross_fields(self) -> NcclTiming:
        for check in self.lean_checks:
            if (reason := check(self.__dict__)) is not None:
                raise ValueError(reason)
        return self
