"""Raw events from hosts besides the periodic sample: kernel-log XIDs and NCCL timings (per rank, grouped per host)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.columns import ch
from schemas.limits import DURATION_US_MAX, GPU_INDEX_MAX, ID_MAX, MAX_GPUS, NAME_MAX, TEXT_MAX

TS = ch("DateTime64(3, 'UTC')")
LC = ch("LowCardinality(String)")
LC_NULL = ch("LowCardinality(Nullable(String))")
UINT32_MAX = 2**32 - 1


class XidEvent(BaseModel):
    """One XID or SXid line (or NVML XID event) as read on a host."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    rack: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    cluster: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    ts: float = Field(gt=0, json_schema_extra=TS)
    kind: Literal["xid", "sxid"] = "xid"
    code: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    pci_bus_id: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL)
    gpu_index: int | None = Field(default=None, ge=0, le=GPU_INDEX_MAX)
    gpu_uuid: str | None = Field(default=None, max_length=ID_MAX)
    gpu_instance: int | None = Field(default=None, ge=0, description="MIG GPU instance id (GPU-I:)")
    pid: int | None = None
    process: str | None = Field(default=None, max_length=NAME_MAX)
    severity: str | None = Field(default=None, max_length=ID_MAX, description="Fatal / Nonfatal where the line carries it (NVLink5, SXid)")
    caused_by: int | None = Field(default=None, description="'caused by previous Xid N' suffix")
    recovery_action: int | None = Field(default=None, ge=0, le=7, description="Xid 154: the new recovery action")
    unit: str | None = Field(default=None, max_length=ID_MAX, description="NVLink5 unit (e.g. RLW_RXPIPE) where the line names one")
    link: int | None = Field(default=None, description="NVLink link number where the line names one")
    count: int = Field(default=1, ge=1, description="exact repeats folded into this event by the collector")
    message: str = Field(default="", max_length=TEXT_MAX)
    raw_line: str = Field(default="", max_length=TEXT_MAX)
    source: Literal["kmsg", "journald", "file", "nvml", "dcgm", "simulator"] = "kmsg"


HOST_SUBSYSTEMS = ("nic", "storage", "filesystem", "machine_check")


class HostEvent(BaseModel):
    """One kernel-log line about the host around the GPUs: its NIC (mlx5), its disks (NVMe, block I/O), its
    filesystems (ext4, XFS) or its CPUs and memory (machine checks, EDAC). `code` names the pattern that matched
    (agents/kernel_log/host_lines.py lists them); the fault-bin stage bins it (streams/fault_bins/host_rules.py)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    rack: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    cluster: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    ts: float = Field(gt=0, json_schema_extra=TS)
    subsystem: Literal[HOST_SUBSYSTEMS] = Field(description="nic, storage, filesystem or machine_check")
    code: str = Field(min_length=1, max_length=ID_MAX, json_schema_extra=LC,
                      description="the matched pattern: mlx5_health_compromised, nvme_controller_down, ...")
    device: str | None = Field(default=None, max_length=ID_MAX, json_schema_extra=LC_NULL,
                               description="what the line names: a PCI address, nvme0, nvme0n1p2, CPU 3 bank 5")
    severity: Literal["fatal", "error", "warning", "corrected"] = "error"
    count: int = Field(default=1, ge=1, description="exact repeats folded into this event by the collector")
    message: str = Field(default="", max_length=TEXT_MAX)
    raw_line: str = Field(default="", max_length=TEXT_MAX)
    source: Literal["kmsg", "journald", "file", "simulator"] = "kmsg"


class HostRecord(BaseModel):
    """The labels every per-host record of an agent starts with (its columns come first, in this order)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    rack: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    cluster: str = Field(default="", max_length=NAME_MAX, json_schema_extra=LC)
    job: str | None = Field(default=None, max_length=NAME_MAX, json_schema_extra=LC_NULL)
    ts: float = Field(gt=0, json_schema_extra=TS)


class AgentStatus(HostRecord):
    """A host agent's own condition: which collectors run, which fail and why, and whether it is stopping.

    Published every `agent_status_every_s` (every `agent_interval_s` while a collector fails or no sample collector
    runs: then it is the host's only sign of life) and at once when a collector starts or stops failing; the last one, with
    `state` "stopping", when the agent is shut down in order (a planned reboot, maintenance). With the samples it
    tells a silent host (nothing at all) from a broken monitor (status, no samples) and from one taken away on
    purpose (a goodbye, then nothing): streams/silence/."""

    seq: int = Field(ge=0, description="per-agent status sequence number", json_schema_extra=ch("UInt64"))
    state: Literal["running", "stopping"] = "running"
    collectors: list[str] = Field(default_factory=list, max_length=64, description="collectors running here",
                                  json_schema_extra=ch("Array(LowCardinality(String))"))
    failing: dict[str, str] = Field(default_factory=dict, max_length=64,
                                    description="collector -> its last error, for each whose last poll failed")
    unsupported: dict[str, str] = Field(default_factory=dict, max_length=64,
                                        description="collector -> why it does not run here")
    source: Literal["agent", "simulator"] = "agent"


def rank_in_world(t: Mapping[str, Any]) -> str | None:
    """A rank numbers one member of its communicator: 0 <= rank < world_size."""
    if t["rank"] >= t["world_size"]:
        return f"rank {t['rank']} is not below world_size {t['world_size']}"
    return None


class NcclTiming(BaseModel):
    """One rank's timing around one collective: compute before it, and time inside it."""

    model_config = ConfigDict(extra="forbid")

    job: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    rank: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    world_size: int = Field(ge=1, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    gpu_index: int | None = Field(default=None, ge=0, le=GPU_INDEX_MAX)
    collective: str = Field(max_length=ID_MAX, json_schema_extra=LC, description="AllReduce, AllGather, ReduceScatter, ...")
    seq: int = Field(ge=0, description="collective sequence number within the job's communicator")
    bytes: int = Field(ge=0)
    ts: float = Field(gt=0, json_schema_extra=TS, description="collective start on this rank, epoch seconds")
    compute_us: float = Field(ge=0, le=DURATION_US_MAX,
                              description="compute time since this rank's previous collective")
    collective_us: float = Field(ge=0, le=DURATION_US_MAX, description="time inside the collective, waiting included")
    source: Literal["inspector", "api", "nccl-tests", "simulator"] = "api"

    lean_checks: ClassVar[tuple] = (rank_in_world,)  # cross-field rules, shared with schemas/validate.py

    @model_validator(mode="after")
    def _cross_fields(self) -> NcclTiming:
        for check in self.lean_checks:
            if (reason := check(self.__dict__)) is not None:
                raise ValueError(reason)
        return self


def ranks_in_world(t: Mapping[str, Any]) -> str | None:
    """Every rank of a step record numbers one member of its communicator."""
    top = max((r["rank"] for r in t["ranks"]), default=-1)
    if top >= t["world_size"]:
        return f"ranks: rank {top} is not below world_size {t['world_size']}"
    return None


class RankTiming(BaseModel):
    """One rank's share of an NcclStep: what differs between the ranks of one host around one collective."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    gpu_index: int | None = Field(default=None, ge=0, le=GPU_INDEX_MAX)
    ts: float = Field(gt=0, json_schema_extra=TS, description="collective start on this rank, epoch seconds")
    compute_us: float = Field(ge=0, le=DURATION_US_MAX,
                              description="compute time since this rank's previous collective")
    collective_us: float = Field(ge=0, le=DURATION_US_MAX, description="time inside the collective, waiting included")


# NcclTiming's fields that the ranks of one host share around one collective: the key of an NcclStep.
STEP_KEY = ("job", "world_size", "host", "collective", "seq", "bytes", "source")


class NcclStep(BaseModel):
    """The timings of one host's ranks around one collective of a job (the wire form of fleet.telemetry.nccl): the
    fields those ranks share once, each rank's own in `ranks`. One record per host and collective instead of one per
    rank (8 per host on an 8-GPU node); the sink stores one nccl_timings row per rank, as for NcclTiming."""

    model_config = ConfigDict(extra="forbid")

    job: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    world_size: int = Field(ge=1, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    host: str = Field(min_length=1, max_length=NAME_MAX, json_schema_extra=LC)
    collective: str = Field(max_length=ID_MAX, json_schema_extra=LC, description="AllReduce, AllGather, ReduceScatter, ...")
    seq: int = Field(ge=0, description="collective sequence number within the job's communicator")
    bytes: int = Field(ge=0)
    source: Literal["inspector", "api", "nccl-tests", "simulator"] = "api"
    ranks: list[RankTiming] = Field(min_length=1, max_length=MAX_GPUS)

    lean_checks: ClassVar[tuple] = (ranks_in_world,)

    @model_validator(mode="after")
    def _cross_fields(self) -> NcclStep:
        for check in self.lean_checks:
            if (reason := check(self.model_dump())) is not None:
                raise ValueError(reason)
        return self


def step_of(timing: Mapping[str, Any]) -> dict:
    """A checked NcclTiming (the older one-record-per-rank form, still accepted on the topic) as an NcclStep."""
    return group_timings([timing])[0]


def group_timings(timings: list[Mapping[str, Any] | NcclTiming]) -> list[dict]:
    """Per-rank timings (dicts or models) as NcclStep dicts: one per job, host and collective, in first-seen order,
    ranks in their order."""
    steps: dict[tuple, dict] = {}
    for t in timings:
        t = t.model_dump(mode="json") if isinstance(t, BaseModel) else t
        key = tuple(t.get(k, "api") if k == "source" else t[k] for k in STEP_KEY)
        step = steps.get(key)
        if step is None:
            steps[key] = step = {**dict(zip(STEP_KEY, key)), "ranks": []}
        step["ranks"].append({"rank": t["rank"], "gpu_index": t.get("gpu_index"), "ts": t["ts"],
                              "compute_us": t["compute_us"], "collective_us": t["collective_us"]})
    return list(steps.values())


def timings_of(step: Mapping[str, Any]) -> list[dict]:
    """An NcclStep dict as the older per-rank NcclTiming dicts (what agents before the step form published)."""
    head = {k: step[k] for k in STEP_KEY}
    return [{**head, **r} for r in step["ranks"]]
