"""The stage registry: stable names (config key FLEETPULSE_STAGES, metric `stage` label, log field) and their wiring."""

from __future__ import annotations

import logging

from core.errors import ConfigError
from streams.lifecycle import stage as lifecycle
from streams.health import stage as health
from streams.fault_bins import stage as fault_bins
from streams.power_thermal import stage as power_thermal
from streams.stragglers import stage as stragglers
from streams.silence import stage as silence
from streams.runtime.spec import StageSpec


# Every stage is a StageSpec on the stream runtime (streams/runtime/): its package, its line here, its settings field
# and its place in .importlinter (docs/architecture.md, adding a stage).
_STAGES: list[StageSpec] = [
    power_thermal.STAGE,
    fault_bins.STAGE,
    stragglers.STAGE,
    silence.STAGE,
    health.STAGE,
    lifecycle.STAGE,
]
STAGES: dict[str, StageSpec] = {s.name: s for s in _STAGES}
# The worker processes, in start order; each is one faust app and consumer group (streams/app.py group_id). The
# decisions worker (lifecycle) reads what the telemetry worker writes; in a process of its own a fault's hops to a
# drain request never wait behind a burst of samples (one consumer would hand it over only after the samples
# fetched before it).
WORKERS = ("telemetry", "decisions")


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


def stage_logger(name: str) -> logging.LoggerAdapter:
    """A logger whose records carry the stage's registry name (`stage` field, and a prefix in plain text)."""

    class _Adapter(logging.LoggerAdapter):
        def process(self, msg, kwargs):
            kwargs.setdefault("extra", {})["stage"] = name
            return f"[{name}] {msg}", kwargs

    return _Adapter(logging.getLogger(f"fleetpulse.streams.{name}"), {"stage": name})
