"""Stages in memory, without faust or Kafka: each step fed batches of records as a lane would feed it, its state writes
kept as a flush keeps them and its durable ones as the changelog would. For tests that hold a step to its outputs
(the same records must give the same outputs in any batches), and for benches that time the steps alone.

`delivery_order` runs every chosen step one record at a time, each output delivered at once to the steps that read
its topic: the order in which a worker that never lags would see every record, internal ones included.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from streams.runtime.lane import input_decoder
from streams.runtime.spec import Emit, Record, StageSpec, Step, Target
from streams.runtime.state import _DELETED, StepState


def partition_of(topic: Target, key: str | None) -> int:
    """A stable partition for a key (crc32, not Kafka's murmur2: only keyed state's changelog partition depends on it)."""
    return 0 if key is None else zlib.crc32(key.encode()) % topic.partitions


@dataclass
class OfflineStep:
    """One step of a stage with the stage's tables (shared by its steps), its memo and its changelog."""

    stage: StageSpec
    step: Step
    config: Any
    tables: dict[str, dict]
    changelog: dict[tuple[str, str], bytes]  # the last durable JSON of each key, as the table's changelog holds it
    memo: dict[str, Any] = field(default_factory=dict)
    durable: dict[tuple[str, str], bytes] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.stage.name}.{self.step.run.__name__}"

    @property
    def live(self) -> dict[str, type]:
        return {t.name: t.live for t in self.stage.tables if t.live is not None}

    def reads(self, topic: Target) -> bool:
        return any(i.topic == topic for i in self.step.inputs)

    def records(self, order: Sequence[Delivery]) -> list[Record]:
        """The records of `order` this step reads, in that order."""
        return [self.record(d.topic, d.key, d.value, d.offset) for d in order if self.reads(d.topic)]

    def record(self, topic: Target, key: str | None, value: Any, offset: int) -> Record:
        kind = next(i.kind for i in self.step.inputs if i.topic == topic)
        return Record(kind, value, key, topic.name, partition_of(topic, key), offset, 0)

    def run(self, records: Sequence[Record]) -> list[Emit]:
        """One batch through the step; its writes applied to the tables, the durable ones to the changelog."""
        state = StepState(self.tables, {r.key: r.partition for r in records if r.key is not None}, memo=self.memo,
                          live=self.live, durable=self.durable, lend=True)
        emits = self.step.run(records, state, self.config)
        for (table, key), (value, durable, _) in state.writes.items():
            if value is _DELETED:
                self.tables[table].pop(key, None)
                self.changelog.pop((table, key), None)
                continue
            self.tables[table][key] = value
            if durable:
                plain = value.to_json() if table in self.live else value
                self.changelog[table, key] = orjson.dumps(plain, option=orjson.OPT_NON_STR_KEYS)
        return emits

    def restart(self) -> None:
        """As after a crash: memory gone, every table recovered from its changelog (JSON values, as faust's)."""
        self.memo.clear()
        self.durable.clear()
        for name, table in self.tables.items():
            table.clear()
            table.update({key: orjson.loads(raw) for (t, key), raw in self.changelog.items() if t == name})


def offline_steps(stages: Iterable[StageSpec], settings: object | None) -> list[OfflineStep]:
    """Every step of `stages`, in their order; the steps of one stage share its tables and changelog."""
    out = []
    for stage in stages:
        tables: dict[str, dict] = {t.name: {} for t in stage.tables}
        changelog: dict[tuple[str, str], bytes] = {}
        config = stage.config(settings)
        out += [OfflineStep(stage, step, config, tables, changelog) for step in stage.steps]
    return out


@dataclass(frozen=True)
class Delivery:
    """One record as the steps read it, and who produced it (None: an input from outside the chosen steps)."""

    topic: Target
    key: str | None
    value: Any
    offset: int
    producer: str | None


def delivery_order(steps: Sequence[OfflineStep], inputs: Iterable[tuple[Target, str | None, Any]]
                   ) -> tuple[list[Delivery], dict[str, list[Emit]]]:
    """Every record in the order a never-lagging worker sees it: each input, then what the steps made of it (and of
    that, first come first delivered) before the next input; and the outputs of each step. Every step reads the
    records of `order` in that order. Runs the steps, so replay on fresh ones."""
    order: list[Delivery] = []
    made: dict[str, list[Emit]] = {s.name: [] for s in steps}
    offsets: dict[str, int] = {}
    decoders = {i.topic: input_decoder(i) for s in steps for i in s.step.inputs}
    for topic, key, value in inputs:
        pending = deque([(topic, key, value, None)])
        while pending:
            topic, key, value, producer = pending.popleft()
            offset = offsets[topic.name] = offsets.get(topic.name, -1) + 1
            order.append(Delivery(topic, key, value, offset, producer))
            for s in steps:
                if not s.reads(topic):
                    continue
                for e in s.run([s.record(topic, key, value, offset)]):
                    made[s.name].append(e)
                    if e.to in decoders:
                        k = e.key.decode(errors="replace") if e.key is not None else None
                        pending.append((e.to, k, decoders[e.to](e.key, e.value), s.name))
    return order, made


def replay(step: OfflineStep, order: Sequence[Delivery], batches: Iterable[int]) -> list[Emit]:
    """`step` over the records of `order` it reads, in batches of the given sizes (the last size repeats); what it
    emits. Records it produced itself are in `order` already, so its own outputs are not fed back."""
    mine = step.records(order)
    out: list[Emit] = []
    sizes, size, first = iter(batches), 1, 0
    while first < len(mine):
        size = next(sizes, size)
        out += step.run(mine[first:first + size])
        first += size
    return out


def by_key(emits: Iterable[Emit]) -> dict[tuple[str, bytes], list[bytes]]:
    """Outputs as Kafka keeps their order: per topic and key."""
    out: dict[tuple[str, bytes], list[bytes]] = {}
    for e in emits:
        out.setdefault((e.to.name, e.key), []).append(e.value)
    return out
