"""One lane: the batch loop that runs every stage of the lane, once, over records of the lane's input topics.

Its records come from its inbox (streams/runtime/inbox.py: straight from the fetch loop) or, with
FLEETPULSE_STREAMS_DIRECT_LANES=false and in faust's agent test contexts, through the lane's faust agent stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import DecodeError
from core.logs import LogBudget
from schemas.codec import decode as json_decode
from schemas.topics import InternalTopic, Topic
from streams.emit import Emitter, send_dead_letter
from streams.faust_adapter.delivery import abandon, acknowledge, batches, dropped, this_assignment
from streams.faust_adapter.tables import Changelog
from streams.metrics import MetricsRegistry, StageMetrics
from streams.runtime.commit import commit
from streams.runtime.inbox import Inbox
from streams.runtime.spec import Emit, Input, Record, StageSpec, Step, Target
from streams.runtime.state import StepState

log = logging.getLogger("fleetpulse.streams.runtime")


@dataclass
class Wired:
    """One step of a stage as the runtime holds it: the stage, the step, built config, faust tables, counters, logger."""

    spec: StageSpec
    step: Step
    config: Any
    tables: dict[str, Any]  # name -> the stage's table (streams/faust_adapter/tables.py)
    metrics: StageMetrics
    log: logging.LoggerAdapter
    memo: dict[str, Any] = field(default_factory=dict)  # the step's in-memory scratch (State.memo)
    live: dict[str, type] = field(default_factory=dict)  # table -> the class its values live as (StateTable.live)
    durable: dict[tuple[str, str], bytes] = field(default_factory=dict)  # a live key's last changelog JSON


@dataclass
class Stepped:
    """A batch whose stages have stepped: its outputs handed to the producer (`pending`: their acknowledgements), each
    stage's state still to write."""

    messages: Sequence[Any]  # the fetched records (faust's Message: topic, partition, offset, key, value, timestamp)
    pending: list[Awaitable]
    done: list[tuple[Wired, StepState]]
    started: float  # perf_counter when the batch was taken
    newest_ms: dict[str, int] = field(default_factory=dict)  # stage -> Kafka timestamp of its newest record here

    def flush(self) -> list[Changelog]:
        """Every stage's state into its tables (in memory); the changelog records to send."""
        return [c for _, state in self.done for c in state.flush()]

    def roll_back(self) -> None:
        for _, state in self.done:
            state.roll_back()


@dataclass
class Source:
    """One input topic of a lane: how its records are decoded and checked, and which stages read them as what."""

    name: str
    decode: Callable[[bytes | None, bytes | None], Any]  # (key, value) -> checked value
    registry: bool  # a refused record is the sink's to dead-letter (it reads every registry topic)
    dlq: str  # where this worker dead-letters the topic's records (internal refusals, rules that raised)
    urgent: bool  # its records go ahead of the rest when behind: an event topic, or an internal one derived from one
    readers: list[tuple[Wired, str]] = field(default_factory=list)


def input_decoder(i: Input) -> Callable[[bytes | None, bytes | None], Any]:
    """(key, value) -> the checked value, as a step reading input `i` gets it: a registry topic's validator, or an
    internal topic's JSON and the input's own check."""
    if isinstance(i.topic, Topic):
        return i.topic.decode_keyed
    check = i.check

    def decode(key: bytes | None, raw: bytes | None) -> Any:
        value = json_decode(raw)
        return check(value) if check is not None else value
    return decode


class Lane:
    """The batch loop of one lane; `target_name` resolves where an Emit goes on this cluster."""

    failed: BaseException | None = None  # what crashed the lane: it takes no more records

    def __init__(self, name: str, stages: Sequence[Wired], *, prefix: str, app_id: str, emitter: Emitter,
                 metrics: MetricsRegistry, batch_max: int, within_s: float, counted: set[str] | None = None):
        self.name, self.stages, self.emitter, self.metrics = name, list(stages), emitter, metrics
        self.prefix, self.app_id, self.batch_max, self.within_s = prefix, app_id, batch_max, within_s
        self.sources: dict[str, Source] = {}
        self.position: dict[tuple[str, int], int] = {}  # next offset to process, per input partition (for lag)
        self.refusals_log = LogBudget()  # every refusal counted (metrics); 20 log lines a minute
        self.inbox: Inbox | None = None  # set by take_direct(): records straight from the fetch loop
        self.app: Any = None  # the worker's app (streams/faust_adapter/app.py), once the lane takes from an inbox
        self._one_batch = asyncio.Lock()  # the inbox and the agent stream (tests) never run batches side by side
        for w in self.stages:
            for i in w.step.inputs:
                full = self.target_name(i.topic)
                src = self.sources.get(full)
                if src is None:
                    registry = isinstance(i.topic, Topic)
                    public = i.topic if registry else i.topic.dead_letters  # an internal topic's registry topic
                    src = self.sources[full] = Source(full, input_decoder(i), registry, public.dlq(prefix),
                                                      not public.periodic)
                src.readers.append((w, i.kind))
        # A topic several lanes read (faults, remediation results) is decoded once per lane; only the first lane
        # that reads it counts and logs its refusals, so a bad record is counted once per worker.
        self.counts = set(self.sources) - (counted or set())
        if counted is not None:
            counted |= self.counts

    def lag(self, highwater: Callable[[str, int], int | None]) -> dict[str, int]:
        """Per stage: records past what this lane has processed on the input partitions it has taken records from."""
        out = {w.spec.name: 0 for w in self.stages}
        for (topic, partition), position in list(self.position.items()):
            end = highwater(topic, partition)
            if end is None or topic not in self.sources:
                continue
            for w, _ in self.sources[topic].readers:
                out[w.spec.name] += max(0, end - position)
        return out

    @property
    def urgent(self) -> list[str]:
        """The input topics whose records go ahead of the rest when behind: event topics, and internal topics derived
        from one (not `Topic.periodic`)."""
        return sorted(name for name, src in self.sources.items() if src.urgent)

    def target_name(self, t: Target) -> str:
        return t.full(self.app_id) if isinstance(t, InternalTopic) else t.full(self.prefix)

    def take_direct(self, app: Any, maxsize: int) -> None:
        """Take records from an inbox the fetch loop fills (streams/faust_adapter/delivery.py), not through faust's
        stream."""
        self.app, self.inbox = app, Inbox(maxsize, frozenset(self.urgent))

    async def run(self, stream) -> None:
        """The lane's loop (the body of its faust agent). Should it raise (a producer error that outlived its retries, a
        runtime bug), every stage of the lane counts the crash (metrics, /healthz) and the lane takes no more records:
        the worker stops, loudly (streams/cli.py), and the next one reads the crashed batch again from the last commit,
        in order. A lane restarted in the same process would go on with the records fetched after that batch, and the
        stages would drop the batch as stale when it came round again."""
        if self.failed is not None:  # faust restarted it: the worker is stopping
            await self._let_go()
        loops = [asyncio.ensure_future(self._from_stream(stream))]
        if self.inbox is not None:
            loops.append(asyncio.ensure_future(self._from_inbox()))
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            for w in self.stages:
                w.metrics.crashed(exc)
            log.error("lane %s crashed: %r; it takes no more records", self.name, exc)
            raise
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)  # a cancelled batch abandons its records first

    async def _let_go(self) -> None:
        """A crashed lane, restarted: it takes nothing more, and hands back what the fetch loop still puts in its inbox
        until the worker stops (within a second), so the fetch loop never waits on it and a record another lane reads
        too is not waited for."""
        if self.inbox is None:
            await asyncio.Event().wait()
        while True:
            abandon(self.app.consumer, await self.inbox.take(self.batch_max, self.within_s))

    async def _from_stream(self, stream) -> None:
        async for messages in batches(stream, self.batch_max, self.within_s):
            try:
                async with self._one_batch:
                    await self.batch(messages)  # faust acknowledges the records after this
            except BaseException:
                dropped(stream, messages)
                raise

    async def _from_inbox(self) -> None:
        """Batches from the inbox; each record tracked as faust's streams track theirs (a rebalance waits until it is
        acknowledged) and acknowledged once its batch's outputs and state are written.

        Pipelined one deep: while a batch's outputs wait for the broker's acknowledgement, then its changelog records
        for theirs, the next batch is already stepped (on the state as the first left it in memory). The writes stay in
        order: a batch's changelog goes out only after its own outputs are acknowledged and the batch before it is
        written, and its records are acknowledged last. Should a batch's writing fail, the lane crashes and neither it
        nor the batch stepped after it is acknowledged: the next worker reads both again from the changelog's state."""
        consumer = self.app.consumer
        writing: asyncio.Task | None = None  # the batch before: its outputs, changelog and acknowledgement
        try:
            while True:
                messages = await this_assignment(self.app, await self._take(writing))
                if not messages:
                    continue
                try:
                    async with self._one_batch:
                        stepped = await self._step(messages)
                    changelog = stepped.flush()  # in memory now, for the next batch; sent once the outputs are acked
                    if writing is not None:
                        await writing
                except BaseException:
                    abandon(consumer, messages)  # uncommitted: the next worker reads them again
                    raise
                writing = asyncio.ensure_future(self._written(stepped, changelog, consumer))
        finally:
            if writing is not None and not writing.done():
                writing.cancel()  # the worker is stopping: what it had not acknowledged is read again
                await asyncio.gather(writing, return_exceptions=True)

    async def _take(self, writing: asyncio.Task | None) -> list:
        """The inbox's next batch; should the batch before fail to be written meanwhile, its error, at once."""
        if writing is None or writing.done():
            if writing is not None:
                writing.result()
            return await self.inbox.take(self.batch_max, self.within_s)
        take = asyncio.ensure_future(self.inbox.take(self.batch_max, self.within_s))
        try:
            await asyncio.wait((take, writing), return_when=asyncio.FIRST_COMPLETED)
            if writing.done() and writing.exception() is not None:
                writing.result()
        except BaseException:
            take.cancel()  # take() pops nothing before its last wait: no record is lost
            await asyncio.gather(take, return_exceptions=True)
            raise
        return await take

    async def _written(self, stepped: Stepped, changelog: list[Changelog], consumer) -> None:
        """A stepped batch committed (streams/runtime/commit.py); else, whatever failed, its records abandoned."""
        try:
            await commit(stepped, self.emitter, lambda: acknowledge(consumer, stepped.messages), changelog)
        except BaseException:
            abandon(consumer, stepped.messages)
            raise
        self._observe(stepped)

    async def batch(self, messages: Sequence[Any]) -> None:
        """Decode once, step every stage, then commit the batch (streams/runtime/commit.py) but for its records' last
        step: faust's agent stream acknowledges them as it moves past them, after this returns."""
        stepped = await self._step(messages)
        await commit(stepped, self.emitter, lambda: None)
        self._observe(stepped)

    def _observe(self, stepped: Stepped) -> None:
        took = time.perf_counter() - stepped.started
        now = time.time()
        for w, _ in stepped.done:
            w.metrics.observe_batch(took, stepped.newest_ms.get(w.spec.name, 0), now)
            # here, in the worker's loop: a faust table read from the metrics thread makes its store there
            w.metrics.state_entries = sum(len(t) for t in w.tables.values())

    async def _step(self, messages: Sequence[Any]) -> Stepped:
        """Decode once and step every stage, handing their outputs to the producer; state not yet written."""
        started = time.perf_counter()
        pending: list[Awaitable] = []
        by_stage: dict[int, list[Record]] = {}
        where: dict[tuple[str, int, int], Any] = {}  # a record's message, should its step refuse it
        for msg in messages:
            where[(msg.topic, msg.partition, msg.offset)] = msg
            self.position[(msg.topic, msg.partition)] = msg.offset + 1
            src = self.sources.get(msg.topic)
            if src is None:
                log.error("lane %s got a record of %s, which none of its stages reads", self.name, msg.topic)
                continue
            try:
                value = src.decode(msg.key, msg.value)
            except DecodeError as exc:
                await self._refuse(pending, src, msg, str(exc))
                continue
            key = msg.key.decode(errors="replace") if msg.key is not None else None
            shared = None  # one Record for the readers that call it the same (it is frozen)
            ts_ms = int((msg.timestamp or 0) * 1000)  # faust's Message.timestamp is in seconds
            for w, kind in src.readers:
                if shared is None or shared.kind != kind:
                    shared = Record(kind, value, key, msg.topic, msg.partition, msg.offset, ts_ms)
                by_stage.setdefault(id(w), []).append(shared)
        stepped = Stepped(messages, pending, [], started)
        try:
            for w in self.stages:
                records = by_stage.get(id(w))
                if not records:
                    continue
                w.metrics.received += len(records)
                stepped.newest_ms[w.spec.name] = max(r.ts_ms for r in records)
                emits, state, failed = run_step(w, records)
                stepped.done.append((w, state))
                await self._send(pending, w, emits, failed, where)
        except BaseException:
            stepped.roll_back()
            raise
        return stepped

    async def _send(self, pending: list[Awaitable], w: Wired, emits: list[Emit], failed: list[tuple[Record, str]],
                    where: dict[tuple[str, int, int], Any]) -> None:
        """Hand one stage's outputs, and the dead letters of the records its rules raised on, to the producer."""
        for rec, reason in failed:
            w.metrics.errors += 1
            show, held = self.refusals_log.take()
            if show:
                w.log.warning("dead-lettered %s[%s]@%s: %s%s", rec.source, rec.partition, rec.offset, reason,
                              self.refusals_log.suffix(held))
            msg = where[(rec.source, rec.partition, rec.offset)]
            pending.append(await send_dead_letter(self.emitter, self.sources[rec.source].dlq, msg, reason,
                                                  f"streams.{w.spec.name}"))
        for e in emits:
            pending.append(await self.emitter.send(self.target_name(e.to), e.key, e.value))
            if e.log:
                w.log.log(e.level, "%s", e.log)
        w.metrics.emitted += sum(1 for e in emits if isinstance(e.to, Topic))

    async def _refuse(self, pending: list[Awaitable], src: Source, msg: Any, reason: str) -> None:
        if src.name not in self.counts:
            return  # another lane of this worker counted it (and, for an internal topic, dead-lettered it)
        self.metrics.refused[src.name] += 1
        show, held = self.refusals_log.take()
        if src.registry:  # counted and logged once here; the sink writes its one dead letter
            if show:
                log.warning("refused %s[%s]@%s (the sink dead-letters it): %s%s", msg.topic, msg.partition,
                            msg.offset, reason, self.refusals_log.suffix(held))
            return
        if show:
            log.warning("dead-lettered %s[%s]@%s: %s%s", msg.topic, msg.partition, msg.offset, reason,
                        self.refusals_log.suffix(held))
        stages = {w.spec.name: w for w, _ in src.readers}
        for w in stages.values():  # the stage's own internal record: it dead-letters it
            w.metrics.errors += 1
        readers = "+".join(stages)
        pending.append(await send_dead_letter(self.emitter, src.dlq, msg, reason, f"streams.{readers}"))


def run_step(w: Wired, records: Sequence[Record]) -> tuple[list[Emit], StepState, list[tuple[Record, str]]]:
    """The stage's step over the batch (lent its live objects); if it raises, the lent objects roll back to their
    last durable values and the batch runs again record by record on copies, so only the records it chokes on are
    refused (their half-made state is dropped, the others' kept)."""
    partitions = {r.key: r.partition for r in records if r.key is not None}
    state = StepState(w.tables, partitions, memo=w.memo, live=w.live, durable=w.durable, lend=True)
    try:
        return w.step.run(records, state, w.config), state, []
    except Exception:  # noqa: BLE001 - a record the validator let through that the rules cannot take
        state.roll_back()
        state = StepState(w.tables, partitions, memo=w.memo, live=w.live, durable=w.durable)
        emits: list[Emit] = []
        failed: list[tuple[Record, str]] = []
        for rec in records:
            trial = state.child()
            try:
                out = w.step.run([rec], trial, w.config)
            except Exception as exc:  # noqa: BLE001
                failed.append((rec, f"{w.spec.name} rules failed: {exc!r}"))
                continue
            trial.merge()
            emits += out
        return emits, state, failed
