"""What a stage declares, and what its pure step sees and returns: no faust and no Kafka in any of it."""

from __future__ import annotations

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
class Table:
    """Keyed state of a stage: a faust table `<stage>-<name>` in memory, recovered from its Kafka changelog."""

    name: str
    help: str
    partitions: int = 8


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
    log: str | None = None  # logged at info once sent: what an operator should see in the worker's log


class State(Protocol):
    """Keyed state handed to a step: reads see the step's own writes; the runtime flushes them after the outputs."""

    def get(self, table: str, key: str, default: Any = None) -> Any: ...

    def put(self, table: str, key: str, value: Any, *, durable: bool = True, partition: int | None = None) -> None:
        """Set `key`; durable writes reach the changelog (on the partition of the records keyed `key`), the others
        stay in memory (state a restart may lose, recovered up to the last durable write)."""


Step = Callable[[Sequence[Record], State, Any], list[Emit]]


@dataclass(frozen=True)
class StageSpec:
    """A stage: its stable name (config key, metric label, log field), where it runs, and what it is made of."""

    name: str
    description: str
    lane: str  # stages of one lane share one consumer and batch loop; a lane owns its input topics
    inputs: tuple[Input, ...]
    outputs: tuple[Target, ...]  # each input's dead-letter topic is an output too
    tables: tuple[Table, ...]
    config: Callable[[Any], Any]  # StreamsSettings -> the stage's rule parameters
    step: Step
    batch_within_s: Callable[[Any], float | None] = lambda config: None  # a rule's own batching window, if any

    def topics(self) -> tuple[Topic, ...]:
        """The registry topics the stage reads (what its consumer lag is measured on)."""
        return tuple(i.topic for i in self.inputs if isinstance(i.topic, Topic))
