"""Derived messages the stages publish: faults, straggler scores, alerts, health, node lifecycle, drains."""

from __future__ import annotations

import hashlib
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.events import LC, LC_NULL, TS, UINT32_MAX
from schemas.columns import ch
from schemas.limits import NAME_MAX


class FaultBin(str, Enum):
    """What to do about a fault, mildest first."""

    IGNORE = "ignore"
    RETRY = "retry"
    RESET = "reset"
    REBOOT = "reboot"
    INSPECT = "inspect"
    REPLACE = "replace"


class NodeLifecycle(str, Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DRAIN_REQUESTED = "drain_requested"
    DRAINED = "drained"
    REPAIRING = "repairing"
    VALIDATING = "validating"
    REPLACE = "replace"


class _Derived(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=True)


class FaultEvent(_Derived):
    """A fault on one GPU (or node), its bin, and the rule and evidence that put it there."""

    fault_id: str = Field(description="stable id: host/gpu/code/bin/window start")
    ts: float = Field(gt=0, json_schema_extra=TS)
    host: str = Field(min_length=1, json_schema_extra=LC)
    rack: str = Field(default="", json_schema_extra=LC)
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    code: str = Field(json_schema_extra=LC, description="xid:79, sxid:12028, ecc_dbe, row_remap_failure, gpu_lost, ...")
    bin: FaultBin = Field(json_schema_extra=LC)
    catalog_action: str | None = Field(default=None, json_schema_extra=LC_NULL)
    rule: str = Field(description="which rule decided the bin (catalog, escalation, workflow)")
    count: int = Field(default=1, ge=1, description="occurrences folded into this event (storm dedup)")
    first_ts: float = Field(gt=0, json_schema_extra=TS)
    last_ts: float = Field(gt=0, json_schema_extra=TS)
    reasons: list[str] = Field(default_factory=list)
    evidence: dict[str, str] = Field(default_factory=dict)


class StragglerScore(_Derived):
    """One rank's standing against the other ranks of its job in one window."""

    ts: float = Field(gt=0, json_schema_extra=TS)
    job: str = Field(json_schema_extra=LC)
    rank: int = Field(ge=0, le=UINT32_MAX, json_schema_extra=ch("UInt32"))
    host: str = Field(json_schema_extra=LC)
    gpu_index: int | None = None
    window_start: float = Field(gt=0, json_schema_extra=TS)
    window_end: float = Field(gt=0, json_schema_extra=TS)
    metric: Literal["compute_us", "arrival_lateness_us"] = "compute_us"
    value: float
    median: float
    mad: float
    z: float
    slowdown_pct: float
    flagged: bool
    windows_flagged: int = Field(ge=0)
    windows_seen: int = Field(ge=0)
    job_slowdown_pct: float = Field(default=0.0, description="estimated job speed lost to this rank")
    reasons: list[str] = Field(default_factory=list)
    evidence: dict[str, float] = Field(default_factory=dict)


class Alert(_Derived):
    """Fire/resolve alert with a stable fingerprint, Alertmanager style."""

    fingerprint: str = Field(description="stable hash of alertname and identifying labels")
    status: Literal["firing", "resolved"]
    alertname: str = Field(json_schema_extra=LC)
    severity: Literal["info", "warning", "critical", "page"] = "warning"
    ts: float = Field(gt=0, json_schema_extra=TS)
    starts_at: float = Field(gt=0, json_schema_extra=TS)
    ends_at: float | None = Field(default=None, json_schema_extra=ch("Nullable(DateTime64(3, 'UTC'))"))
    host: str = Field(default="", json_schema_extra=LC)
    rack: str = Field(default="", json_schema_extra=LC)
    gpu_index: int | None = None
    value: float = Field(description="the measured value that crossed (or came back under) the threshold")
    threshold: float
    summary: str
    labels: dict[str, str] = Field(default_factory=dict)
    evidence: dict[str, float] = Field(default_factory=dict)


def fingerprint(alertname: str, *, host: str = "", gpu_index: int | None = None, rack: str = "") -> str:
    """Stable across processes and restarts: sha256 of the alert name and the labels that identify its subject."""
    ident = f"{alertname}|host={host}|gpu={'' if gpu_index is None else gpu_index}|rack={rack}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


class Penalty(BaseModel):
    """One weighted deduction from a health score, with its reason."""

    model_config = ConfigDict(extra="forbid")

    name: str
    value: float
    points: float = Field(ge=0)
    reason: str


class HealthScore(_Derived):
    """0-100 health of one GPU (gpu_index set) or one node (gpu_index None), with gates and penalties."""

    ts: float = Field(gt=0, json_schema_extra=TS)
    host: str = Field(json_schema_extra=LC)
    rack: str = Field(default="", json_schema_extra=LC)
    gpu_index: int | None = None
    score: float = Field(ge=0, le=100)
    schedulable: bool
    gates: list[str] = Field(default_factory=list, description="hard gates that fired (any one: unschedulable)")
    penalties: list[Penalty] = Field(default_factory=list)
    inputs: dict[str, float] = Field(default_factory=dict)
    job: str | None = Field(default=None, max_length=NAME_MAX, json_schema_extra=LC_NULL,
                            description="the job the host's latest sample names (node rows): what draining it stops")


class NodeState(_Derived):
    """A node's lifecycle state; the topic is compacted, keyed by host."""

    host: str = Field(json_schema_extra=LC)
    state: NodeLifecycle = Field(json_schema_extra=LC)
    prev_state: NodeLifecycle | None = Field(default=None, json_schema_extra=LC_NULL)
    since: float = Field(gt=0, json_schema_extra=TS)
    ts: float = Field(gt=0, json_schema_extra=TS)
    schedulable: bool
    reason: str = ""
    evidence: dict[str, str] = Field(default_factory=dict)


class DrainEvent(_Derived):
    """A request to remediation bots: drain, repair, validate, return to service, or replace."""

    event_id: str
    host: str = Field(json_schema_extra=LC)
    action: Literal["drain", "repair", "validate", "undrain", "replace"] = Field(json_schema_extra=LC)
    ts: float = Field(gt=0, json_schema_extra=TS)
    reason: str
    evidence: dict[str, str] = Field(default_factory=dict)
    requirements: dict[str, float] = Field(
        default_factory=dict, description="what must pass, e.g. dcgm_diag_level, nccl_busbw_min_gbs"
    )


class RemediationResult(_Derived):
    """A remediation bot's answer to a drain event."""

    event_id: str
    host: str = Field(json_schema_extra=LC)
    action: Literal["drain", "repair", "validate", "undrain", "replace"] = Field(json_schema_extra=LC)
    ok: bool
    ts: float = Field(gt=0, json_schema_extra=TS)
    detail: str = ""
    measurements: dict[str, float] = Field(default_factory=dict)


class UsableCompute(_Derived):
    """The fleet's usable compute for one minute: schedulable GPUs x performance factor / installed GPUs, and where
    the rest went (shares of installed GPUs, and the same in GPUs)."""

    scope: str = Field(default="fleet", json_schema_extra=LC, description="what the figure covers")
    minute_ts: float = Field(gt=0, json_schema_extra=TS, description="start of the minute")
    nodes: int = Field(ge=0, description="nodes the lifecycle has heard from")
    installed_gpus: float = Field(ge=0)
    schedulable_gpus: float
    usable_gpus: float
    usable_compute: float = Field(description="usable GPUs / installed GPUs")
    breakdown: dict[str, float] = Field(default_factory=dict, description="share of installed GPUs per bucket")
    breakdown_gpus: dict[str, float] = Field(default_factory=dict, description="GPUs per bucket")


class InjectedFault(_Derived):
    """Simulator ground truth: what was injected where and when, so detection can be scored."""

    run_id: str = Field(json_schema_extra=LC)
    fault_id: str
    kind: str = Field(json_schema_extra=LC, description="xid79, thermal_runaway, power_cap, slow_rank, ecc_dbe, ...")
    cause: str = Field(default="", json_schema_extra=LC,
                       description="the scenario's root-cause label (faulty_gpu, hbm3, ...), so scores split by cause")
    host: str = Field(json_schema_extra=LC)
    rack: str = Field(default="", json_schema_extra=LC)
    gpu_index: int | None = None
    job: str | None = Field(default=None, json_schema_extra=LC_NULL)
    rank: int | None = None
    ts: float = Field(gt=0, json_schema_extra=TS, description="injection start")
    end_ts: float | None = Field(default=None, json_schema_extra=ch("Nullable(DateTime64(3, 'UTC'))"))
    hardware: bool = Field(default=True, description="False for faults with no hardware cause (software bugs)")
    expected: list[str] = Field(default_factory=list, description="signals a detector should raise")
    allowed: list[str] = Field(default_factory=list, description="signals a detector may raise or not: a band where "
                               "timing decides (neither counted as found nor as false)")
    params: dict[str, float] = Field(default_factory=dict)
