"""Scenario files: the JSON format of timed fault injections, validated with the offending field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetpulse.errors import ConfigError

SCENARIO_DIR = Path(__file__).parent / "scenarios"
SHUTDOWN_TEMP_C = 92.0


class _Fault(BaseModel):
    """Fields every injection has: when (seconds after the run's start), for how long, and where."""

    model_config = ConfigDict(extra="forbid")

    at: float = Field(ge=0, description="seconds of simulated time after the run's start")
    duration: float | None = Field(default=None, gt=0, description="seconds; omitted = until the run ends")
    host: int | str | None = Field(default=None, description="host index or hostname")
    gpu: int | None = Field(default=None, ge=0, le=7, description="GPU index on the host; omitted = every GPU")
    job: int | str | None = Field(default=None, description="job index or name (with rank)")
    rank: int | None = Field(default=None, ge=0)
    hardware: bool | None = Field(default=None, description="override the ground truth's hardware flag")
    note: str = ""

    @model_validator(mode="after")
    def _one_target(self):
        by_host, by_job = self.host is not None, self.job is not None
        if by_host == by_job:
            raise ValueError("give exactly one target: host (with optional gpu) or job with rank")
        if by_job and self.rank is None:
            raise ValueError("rank is required with job")
        if by_host and self.rank is not None:
            raise ValueError("rank goes with job, not host")
        if by_job and self.gpu is not None:
            raise ValueError("gpu goes with host, not job")
        return self

    @property
    def end(self) -> float:
        return float("inf") if self.duration is None else self.at + self.duration


COMMON_FIELDS = frozenset(_Fault.model_fields)


class XidFault(_Fault):
    kind: Literal["xid"]
    code: int = Field(ge=1, le=65535)
    message: str | None = Field(default=None, description="text after 'NN, '; default: a real line of that code")
    count: int = Field(default=1, ge=1, le=10000, description="how many lines (a storm when > 1)")
    every: float = Field(default=1.0, gt=0, description="seconds between repeated lines")
    caused_by: int | None = Field(default=None, ge=1, description="adds 'caused by previous Xid N'")


class ThermalRunaway(_Fault):
    kind: Literal["thermal_runaway"]
    peak_c: float = Field(default=91.0, gt=40, lt=SHUTDOWN_TEMP_C, description="temperature the GPU climbs to")
    ramp_s: float = Field(default=15.0, ge=0, description="seconds from normal to peak")


class PowerCap(_Fault):
    kind: Literal["power_cap"]
    cap_w: float = Field(default=400.0, ge=100, le=700, description="enforced power limit while active")


class SlowRank(_Fault):
    kind: Literal["slow_rank"]
    slowdown_pct: float = Field(gt=0, le=500, description="compute time grows by this percentage")


class EccDbe(_Fault):
    kind: Literal["ecc_dbe"]


class RowRemapFailure(_Fault):
    kind: Literal["row_remap_failure"]


class NvlinkCrc(_Fault):
    kind: Literal["nvlink_crc"]
    rate_per_s: float = Field(default=50.0, gt=0, le=1e6, description="mean CRC errors added per second")


class PcieReplay(_Fault):
    kind: Literal["pcie_replay"]
    rate_per_s: float = Field(default=5.0, gt=0, le=1e6, description="mean PCIe replays added per second")


class GpuLost(_Fault):
    kind: Literal["gpu_lost"]


FaultSpec = Annotated[
    Union[XidFault, ThermalRunaway, PowerCap, SlowRank, EccDbe, RowRemapFailure, NvlinkCrc, PcieReplay, GpuLost],
    Field(discriminator="kind"),
]
KINDS = ("xid", "thermal_runaway", "power_cap", "slow_rank", "ecc_dbe", "row_remap_failure", "nvlink_crc",
         "pcie_replay", "gpu_lost")


class Scenario(BaseModel):
    """A named list of fault injections."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    description: str = ""
    faults: list[FaultSpec] = Field(default_factory=list)


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())


def available() -> list[str]:
    """Names of the scenarios shipped with the package."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def resolve_path(ref: str | Path) -> Path:
    """A path as given, or the name of a shipped scenario ('thermal-runaway')."""
    path = Path(ref)
    if path.suffix != ".json" and len(path.parts) == 1:
        path = SCENARIO_DIR / f"{ref}.json"
    if not path.is_file():
        raise ConfigError(f"scenario {ref!r} not found (no file {path}); shipped: {', '.join(available())}")
    return path


def parse_scenario(data: dict, origin: str = "<scenario>") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid scenario {origin}: {_problems(exc)}") from None


def load_scenario(ref: str | Path | dict | Scenario | None) -> Scenario:
    """Load a scenario from a file path, a shipped name, a dict, or pass one through; None = no faults."""
    if ref is None:
        return Scenario(name="none")
    if isinstance(ref, Scenario):
        return ref
    if isinstance(ref, dict):
        return parse_scenario(ref)
    path = resolve_path(ref)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"scenario {path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    return parse_scenario(data, str(path))
