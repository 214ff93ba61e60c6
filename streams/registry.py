"""The stage registry: stable names (config key FLEETPULSE_STAGES, metric `stage` label, log field) and their wiring."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import faust

from core.errors import ConfigError
from schemas.topics import NCCL, SAMPLES, STRAGGLERS, Topic
from streams import stragglers_stage
from streams.lifecycle import stage as lifecycle
from streams.health import stage as health
from streams.fault_bins import stage as fault_bins
from streams.power_thermal import stage as power_thermal
from streams.runtime.spec import StageSpec
from streams.context import StageContext


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[Topic, ...]
    outputs: tuple[Topic, ...]  # each input's dead-letter topic is an output too
    wire: Callable[[faust.App, StageContext], list]  # registers the stage's agents and tables; returns the agents
    description: str
    worker: str = "telemetry"

    def topics(self) -> tuple[Topic, ...]:
        """The registry topics the stage reads (what its consumer lag is measured on)."""
        return self.inputs


# Stages on the stream runtime (streams/runtime/) are StageSpecs; the rest still wire faust agents of their own.
_STAGES: list[Stage | StageSpec] = [
    power_thermal.STAGE,
    fault_bins.STAGE,
    Stage("stragglers", (NCCL, SAMPLES), (STRAGGLERS,), stragglers_stage.wire,
          "per-rank robust z of compute or arrival lateness, K of N windows, GPU throttle/temperature -> scores"),
    health.STAGE,
    lifecycle.STAGE,
]
STAGES: dict[str, Stage | StageSpec] = {s.name: s for s in _STAGES}
# The worker processes, in start order; each is one faust app and consumer group (streams/app.py group_id). The
# decisions worker (lifecycle) reads what the telemetry worker writes; in a process of its own a fault's hops to a
# drain request never wait behind a burst of samples (one consumer would hand it over only after the samples
# fetched before it).
WORKERS = ("telemetry", "decisions")


def select(names: list[str] | None) -> list[Stage | StageSpec]:
    """The stages to run, in registry order; None or empty means all. Unknown names stop start-up."""
    if not names:
        return list(_STAGES)
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    return [s for s in _STAGES if s.name in names]


def workers(stages: list[Stage | StageSpec]) -> dict[str, list[Stage | StageSpec]]:
    """The chosen stages by the worker they run in, in WORKERS order."""
    out: dict[str, list[Stage | StageSpec]] = {}
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
