"""The stage registry: stable names (config key FLEETPULSE_STAGES, metric `stage` label, log field) and their wiring."""

from __future__ import annotations

from importlib.metadata import entry_points

from core.errors import ConfigError
from streams.lifecycle import stage as lifecycle
from streams.health import stage as health
from streams.fault_bins import stage as fault_bins
from streams.power_thermal import stage as power_thermal
from streams.stragglers import stage as stragglers
from streams.silence import stage as silence
from streams.runtime.spec import StageSpec


# The worker processes, in start order; each is one faust app and consumer group (streams/groups.py group_id). The
# decisions worker (lifecycle) reads what the telemetry worker writes; in a process of its own a fault's hops to a
# drain request never wait behind a burst of samples (one consumer would hand it over only after the samples
# fetched before it).
WORKERS = ("telemetry", "decisions")
# A stage from a package of its own (a site's rules) is one line in that package's metadata:
# `[project.entry-points."fleetpulse.stages"] hot_gpus = "site_rules.stage:STAGE"`. Installed beside fleetpulse, it
# runs, is configured (its Settings), measured and dead-lettered as the built-in stages are (docs/architecture.md).
ENTRY_POINTS = "fleetpulse.stages"


def installed(built_in: list[StageSpec]) -> list[StageSpec]:
    """The stages installed packages name under ENTRY_POINTS, by entry-point name, after the built-in ones."""
    out: list[StageSpec] = []
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        spec = point.load()
        where = f"entry point {point.name} = {point.value} ({ENTRY_POINTS})"
        if not isinstance(spec, StageSpec):
            raise ConfigError(f"{where} is a {type(spec).__name__}, not a StageSpec")
        if spec.name in {s.name for s in built_in + out}:
            raise ConfigError(f"{where}: a stage named {spec.name!r} is already registered")
        if spec.worker not in WORKERS:
            raise ConfigError(f"{where}: worker {spec.worker!r} is not one of {', '.join(WORKERS)}")
        out.append(spec)
    return out


# Every stage is a StageSpec on the stream runtime (streams/runtime/): its package (its settings with it), its line
# here and its place in .importlinter (docs/architecture.md, adding a stage).
BUILT_IN: list[StageSpec] = [
    power_thermal.STAGE,
    fault_bins.STAGE,
    stragglers.STAGE,
    silence.STAGE,
    health.STAGE,
    lifecycle.STAGE,
]
_STAGES = BUILT_IN + installed(BUILT_IN)
STAGES: dict[str, StageSpec] = {s.name: s for s in _STAGES}


def select(names: list[str] | None) -> list[StageSpec]:
    """The stages to run, in registry order; None or empty means all. Unknown names stop start-up."""
    if not names:
        return list(_STAGES)
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    return [s for s in _STAGES if s.name in names]


def workers(stages: list[StageSpec]) -> dict[str, list[StageSpec]]:
    """The chosen stages by the worker they run in, in WORKERS order."""
    out: dict[str, list[StageSpec]] = {}
    for w in WORKERS:
        mine = [s for s in stages if s.worker == w]
        if mine:
            out[w] = mine
    return out

