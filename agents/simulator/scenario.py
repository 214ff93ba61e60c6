"""Scenario files: the fleet, run defaults, faults and fault generators of one run, validated with the field named."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import (BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from agents.simulator.fleet import CHECKPOINT_S
from agents.simulator.kinds import FAULT_ADAPTER, FaultSpec
from core.errors import ConfigError

SCENARIO_DIR = Path(__file__).parent / "scenarios"
# What a run uses when neither the caller nor the scenario says (the simulate CLI's historic defaults).
RUN_DEFAULTS = {"hosts": 16, "duration_s": 60.0, "interval_s": 1.0, "nccl_interval_s": 1.0, "seed": 0}
PLACED_BY_GENERATOR = ("at", "host", "job", "rank")


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FleetSpec(_Block):
    """The fleet a scenario was written for; its targets (job-0000 rank 517) only make sense on this layout."""

    hosts: int | None = Field(default=None, ge=1, le=100_000, description="default host count")
    jobs: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, description="host count of each job, packed from host 0; omitted = the seeded random layout")
    hosts_per_rack: int = Field(default=16, ge=1)
    nvlink_domain_hosts: int = Field(default=1, ge=1, le=72, description="hosts (trays) per NVLink domain, packed "
                                     "from host 0: 1 = each HGX board its own domain; 18 = GB200 NVL72 (one fabric "
                                     "clique per 18 trays)")
    checkpoint_s: PositiveFloat = Field(default=CHECKPOINT_S, description="between each job's checkpoints (job k at "
                                        "phase k x 0.618 of the interval): a drain asked for after the job waits "
                                        "for the next one; a job stopped loses the work since the last")
    rack_budgets_w: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="rack power budgets, carried for the stream worker (the simulator ignores)")

    @field_validator("jobs")
    @classmethod
    def _jobs_fit(cls, jobs: list[int] | None, info: ValidationInfo) -> list[int] | None:
        hosts = info.data.get("hosts")
        if jobs is not None and hosts is not None and sum(jobs) > hosts:
            raise ValueError(f"the jobs need {sum(jobs)} hosts, the fleet has {hosts}")
        return jobs


class RunSpec(_Block):
    """Defaults for `fleetpulse simulate` (its flags win)."""

    duration_s: float | None = Field(default=None, gt=0)
    interval_s: float | None = Field(default=None, gt=0)
    nccl_interval_s: float | None = Field(default=None, ge=0, description="0 = no NCCL records")
    seed: int | None = Field(default=None, ge=0)
    phases: int = Field(default=1, ge=1, le=1000, description="in real time, the hosts report at this many evenly "
                        "spaced moments of each interval, each stamping its own moment, as agents started at "
                        "different times do (1 = every host at the interval's start)")


class Cause(_Block):
    """One root cause of a generator: its share of the faults and the fault a host with that cause shows."""

    cause: str = Field(min_length=1)
    weight: float = Field(gt=0)
    hardware: bool | None = Field(default=None, description="override the truth's hardware flag")
    fault: dict = Field(description="a fault without at/host/job/rank: kind, its parameters, optional gpu/duration")

    @field_validator("fault")
    @classmethod
    def _template(cls, fault: dict) -> dict:
        placed = [k for k in PLACED_BY_GENERATOR if k in fault]
        if placed:
            raise ValueError(f"{', '.join(placed)}: placed by the generator, leave out")
        try:
            FAULT_ADAPTER.validate_python({**fault, "at": 0, "host": 0})
        except ValidationError as exc:
            raise ValueError(_problems(exc)) from None
        return fault


class Generate(_Block):
    """Faults drawn at load time from the run's seed: how many, when, and their causes in proportion."""

    count: int | None = Field(default=None, ge=0, le=1_000_000)
    share_of_hosts: float | None = Field(default=None, gt=0, le=1, description="count = round(share x hosts)")
    between: tuple[Annotated[float, Field(ge=0)], Annotated[float, Field(ge=0)]] = Field(
        description="[t0, t1] seconds; t0 == t1 puts every fault at t0 (a storm)")
    distinct_hosts: bool = True
    causes: list[Cause] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self):
        if (self.count is None) == (self.share_of_hosts is None):
            raise ValueError("give exactly one of count and share_of_hosts")
        if self.between[0] > self.between[1]:
            raise ValueError("between: t0 must not be after t1")
        return self


@dataclass(frozen=True)
class RunPlan:
    """The concrete settings of one run after caller > scenario > RUN_DEFAULTS."""

    hosts: int
    duration_s: float
    interval_s: float
    nccl_interval_s: float
    seed: int
    phases: int = 1


class Scenario(_Block):
    """A named run: the fleet it needs, run defaults, fault injections, and generators of more faults."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    description: str = ""
    fleet: FleetSpec = Field(default_factory=FleetSpec)
    run: RunSpec = Field(default_factory=RunSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    generate: list[Generate] = Field(default_factory=list)
    pipeline: dict[str, dict] = Field(
        default_factory=dict, description="stream-worker rule parameters for `fleetpulse evaluate` (fault_bins, "
                                          "health, lifecycle, breaker: each the JSON of that StreamsSettings field)")
    bot: dict[str, object] = Field(
        default_factory=dict, description="the simulated remediation bot's delays for `fleetpulse evaluate` and "
                                          "`fleetpulse up` (fleetpulse/evaluate/bot.py SimulatedBotConfig)")

    def plan(self, *, hosts: int | None = None, duration_s: float | None = None, interval_s: float | None = None,
             nccl_interval_s: float | None = None, seed: int | None = None) -> RunPlan:
        """Fill what the caller left None from the scenario's fleet/run blocks, then from RUN_DEFAULTS."""
        given = {"hosts": hosts, "duration_s": duration_s, "interval_s": interval_s,
                 "nccl_interval_s": nccl_interval_s, "seed": seed}
        own = {"hosts": self.fleet.hosts, **self.run.model_dump()}
        return RunPlan(**{k: next(v for v in (given[k], own[k], RUN_DEFAULTS[k]) if v is not None) for k in given},
                       phases=self.run.phases)


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
