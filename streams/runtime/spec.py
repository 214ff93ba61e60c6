"""What a stage declares, and what its pure step sees and returns: no faust and no Kafka in any of it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.topics import InternalTopic, Topic

Target = Topic | InternalTopic


@dataclass(frozen=True)
class Input:
    """One input of a stage: a registry topic (checked by its validator) or an internal one (checked by `check`,
    a function of the JSON-decoded value that raises core.errors.DecodeError)."""

    topic: Target
    kind: str  # what the step calls these records
    check: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class StateTable:
    """Keyed state of a stage: a faust table `<stage>-<name>` in memory, recovered from its Kafka changelog."""

    name: str
    help: str
    partitions: int = 8
    # The class of a table whose values live as objects (from_json(dict), to_json(), copy()): kept as objects in
    # memory, their JSON on the changelog. get() lends the step the stored object itself, which it may change and
    # put(); if the step raises, what it borrowed goes back to its last durable value (streams/runtime/state.py).
    # None: plain JSON values.
    live: type | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One checked input record as a step sees it."""

    kind: str
    value: Any
    key: str | None  # the Kafka key: the host, job or rack whose state the record moves
    source: str  # the topic's name on the cluster
    partition: int
    offset: int
    ts_ms: int


@dataclass(frozen=True, slots=True)
class Emit:
    """One output record; the runtime sends it to `to` (prefixed, or under the app id for internal topics)."""

    to: Target
    key: bytes
    value: bytes
    log: str | None = None  # logged once sent: what an operator should see in the worker's log
    level: int = logging.INFO


class State(Protocol):
    """Keyed state handed to a step: reads see the step's own writes; the runtime flushes them after the outputs.

    `memo` is this worker's scratch for the step, kept across batches in memory only (lost on a restart, not moved on
    a rebalance): for pacing what and when the step sends (a changelog write, a clock tick), never for what it
    decides.
    """

    memo: dict[str, Any]

    def get(self, table: str, key: str, default: Any = None) -> Any:
        """The value of `key` (for a `live` table an object the step may change, and put() to keep), or `default`."""

    def scan(self, table: str, prefix: str = "") -> dict[str, Any]:
        """Every key of `table` starting with `prefix` (a small table's view of everything it holds; read-only: the
        live objects themselves, not copies)."""

    def put(self, table: str, key: str, value: Any, *, durable: bool = True, partition: int | None = None) -> None:
        """Set `key`; durable writes reach the changelog (on the partition of the records keyed `key`), the others
        stay in memory (state a restart may lose, recovered up to the last durable write)."""

    def delete(self, table: str, key: str, *, partition: int | None = None) -> None:
        """Remove `key` from `table` and its changelog (a tombstone, on the partition as for put)."""


StepFn = Callable[[Sequence[Record], State, Any], list[Emit]]


def stage_logger(name: str) -> logging.LoggerAdapter:
    """A logger whose records carry the stage's registry name (`stage` field, and a prefix in plain text): the one
    the runtime logs a stage's outputs and refusals with, and a stage's own for what else it has to say."""

    class _Adapter(logging.LoggerAdapter):
        def process(self, msg, kwargs):
            kwargs.setdefault("extra", {})["stage"] = name
            return f"[{name}] {msg}", kwargs

    return _Adapter(logging.getLogger(f"fleetpulse.streams.{name}"), {"stage": name})


def _no_window(config: Any) -> float | None:
    return None


@dataclass(frozen=True)
class Step:
    """One batch loop's share of a stage: the lane it runs in, what it reads there, and its pure function."""

    lane: str  # the steps of one lane share one faust agent and batch loop, and so one decode per record
    inputs: tuple[Input, ...]
    run: StepFn
    batch_within_s: Callable[[Any], float | None] = _no_window  # a rule's own batching window, if any


@dataclass(frozen=True)
class Setting:
    """A block of rule parameters a stage owns: the worker's setting `name` (FLEETPULSE_<NAME>, one JSON object),
    checked by `model`, whose defaults apply where it is unset. The worker's settings are made of the stages'
    (streams/settings.py), so a stage brings its settings with it."""

    name: str
    model: type
    help: str

    def of(self, settings: Any) -> Any:
        """This block of the worker's settings, or the model's defaults (no settings, or settings without it)."""
        value = getattr(settings, self.name, None)
        return value if isinstance(value, self.model) else self.model()


@dataclass(frozen=True)
class StageSpec:
    """A stage: its stable name (config key, metric label, log field) and what it is made of. Most stages have one
    step; one whose parts must not wait for each other (a per-node step and one fleet-wide step) has several."""

    name: str
    description: str
    steps: tuple[Step, ...]
    outputs: tuple[Target, ...]  # each input's dead-letter topic is an output too
    tables: tuple[StateTable, ...]  # shared by the stage's steps
    config: Callable[[Any], Any]  # StreamsSettings -> the stage's rule parameters
    settings: tuple[Setting, ...] = ()  # the settings blocks it owns (config reads them with Setting.of)
    # The worker process it runs in (one consumer group each): a stage whose outputs must not queue behind a burst
    # of telemetry runs in a worker of its own (streams/registry.py WORKERS).
    worker: str = "telemetry"

    def topics(self) -> tuple[Topic, ...]:
        """The registry topics the stage reads (what its consumer lag is measured on)."""
        found = (i.topic for s in self.steps for i in s.inputs if isinstance(i.topic, Topic))
        return tuple(dict.fromkeys(found))
