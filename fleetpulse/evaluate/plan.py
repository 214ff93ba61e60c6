"""From a scenario reference and `--set` overrides to a Plan: the scenario's own fleet, run and pipeline blocks,
with the command line winning."""

from __future__ import annotations

import json
from collections.abc import Sequence

from agents.simulator.scenario import parse_scenario, resolve_path
from core.errors import ConfigError
from fleetpulse.evaluate.bot import bot_config
from fleetpulse.evaluate.evaluation import Plan

PIPELINE_FIELDS = ("fault_bins", "health", "lifecycle", "breaker", "silence", "stragglers")
# What every evaluation sets unless its scenario says otherwise. Flat out, simulated time runs 20-50x faster than the
# wall clock, and the silence stage's wall-clock wait (against spools replaying after an outage, which the
# simulator's agents never do) would hold each judgement for minutes of simulated time: 1 s here. For the same reason
# a drain's round trip through the breaker, a second or two of wall time, is a minute or more of simulated time: the
# lifecycle reports each minute's usable compute 120 s after it, not 30 s.
PIPELINE_DEFAULTS = {"silence": {"wall_wait_s": 1.0}, "lifecycle": {"minute_lateness_s": 120.0}}


def apply_override(doc: dict, assignment: str) -> None:
    """Set one dotted path ('faults.0.slowdown_pct=20') in the scenario document; the value is JSON (bare words
    are taken as strings). Lists are indexed by number; missing objects on the way are created."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise ConfigError(f"--set {assignment!r}: expected PATH=VALUE")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    keys = path.split(".")
    node = doc
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"--set {path}: {'.'.join(keys[:i]) or 'scenario'} has no item {key}")
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise ConfigError(f"--set {path}: {'.'.join(keys[:i])} is a value, not an object or list")


def load_document(ref: str) -> dict:
    path = resolve_path(ref)
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"scenario {path} is not JSON: {exc}") from None


def pipeline_env(pipeline: dict[str, dict]) -> dict[str, str]:
    """The scenario's stream-worker parameters as FLEETPULSE_* variables, checked now so a typo fails before any
    part starts (with the field named), not in the worker's log."""
    from pydantic import ValidationError

    from streams.settings import StreamsSettings

    env = {}
    pipeline = {**PIPELINE_DEFAULTS, **{k: {**PIPELINE_DEFAULTS.get(k, {}), **v} for k, v in pipeline.items()}}
    for name, value in pipeline.items():
        field = StreamsSettings.model_fields.get(name)
        if name not in PIPELINE_FIELDS or field is None:
            raise ConfigError(f"scenario pipeline.{name}: not one of {', '.join(PIPELINE_FIELDS)}")
        try:
            field.annotation.model_validate(value)
        except ValidationError as exc:
            where = "; ".join(f"pipeline.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"scenario {where}") from None
        env[f"FLEETPULSE_{name.upper()}"] = json.dumps(value)
    return env


def plan_from(ref: str, overrides: Sequence[str] = (), *, seed: int | None = None, **options) -> Plan:
    """The Plan for scenario `ref` (a shipped name or a file) after `overrides`; options go to Plan."""
    doc = load_document(ref)
    for assignment in overrides:
        apply_override(doc, assignment)
    scenario = parse_scenario(doc, ref)
    run = scenario.plan(seed=seed)
    if options.get("bot") is None:
        options["bot"] = bot_config(scenario.bot)
    return Plan(scenario=scenario, hosts=run.hosts, duration_s=run.duration_s, interval_s=run.interval_s,
                nccl_interval_s=run.nccl_interval_s, seed=run.seed, streams_env=pipeline_env(scenario.pipeline),
                **{k: v for k, v in options.items() if v is not None})
