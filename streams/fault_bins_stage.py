"""The fault-bin faust stage: XID events and host samples in (co-partitioned by host), fault events out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING

import faust
from faust.types import EventT

from core.errors import DecodeError
from schemas.codec import decode, encode
from schemas.topics import FAULTS, SAMPLES, XID
from streams.emit import refuse as refuse_record
from streams.emit import refuse_invalid
from streams.fault_bins import Evaluation, evaluate
from streams.fault_settings import FaultBinConfig, fault_config
from streams.fault_state import HostState
from streams.state import put

if TYPE_CHECKING:
    from streams.context import StageContext

COMPONENT = "streams.fault_bins"
TOPICS = {"xid": XID, "sample": SAMPLES}


def kind_of(topic: str, names: Mapping[str, str], value: object) -> str:
    """'xid' or 'sample': by source topic, else (a test channel, or a renamed topic) by the record's shape."""
    if topic in names:
        return names[topic]
    return "sample" if isinstance(value, dict) and "gpus" in value else "xid"


def evaluate_isolating(items: Sequence[tuple[EventT, tuple[str, dict]]], prior: Mapping[str, dict | None],
                       config: FaultBinConfig) -> tuple[Evaluation, list[tuple[EventT, str]]]:
    """Evaluate a batch against the table's JSON state; if the rules raise, redo it record by record so only the
    offending records are refused."""
    try:
        states = {h: HostState.from_json(raw) for h, raw in prior.items()}
        return evaluate([r for _, r in items], states, config, owned=True), []
    except Exception:  # noqa: BLE001 - a record the lean shape check let through; isolate it below
        states = {h: HostState.from_json(raw) for h, raw in prior.items()}
        merged, failed = Evaluation([], {}), []
        for event, rec in items:
            try:
                one = evaluate([rec], states, config)
            except Exception as exc:  # noqa: BLE001
                failed.append((event, f"fault_bins rules failed: {exc!r}"))
                continue
            merged.faults += one.faults
            merged.stats.update(one.stats)
            merged.state.update(one.state)
            states.update(one.state)
        return merged, failed


def wire(app: faust.App, ctx: StageContext) -> list:
    """Register the stage: one agent over both topics, so one host's XIDs and samples meet one table entry."""
    s, m, log = ctx.settings, ctx.metrics, ctx.log
    config = fault_config(s)
    names = {XID.full(s.topic_prefix): "xid", SAMPLES.full(s.topic_prefix): "sample"}
    dlq = {"xid": XID.dlq(s.topic_prefix), "sample": SAMPLES.dlq(s.topic_prefix)}
    faults_topic = FAULTS.full(s.topic_prefix)
    source = app.topic(*names, key_serializer="raw", value_serializer="raw")
    hosts = app.Table("fault_bins-hosts", partitions=XID.partitions,
                      help="per-host GPU counter memory, fault history and open dedup windows (keyed by host)")

    async def refuse(pending: list[Awaitable], event: EventT, kind: str, reason: str) -> None:
        await refuse_record(ctx, pending, event, dlq[kind], reason, COMPONENT)

    async def fault_bins(stream):
        async for events in stream.take_events(s.streams_batch_max, within=config.batch_within_s):
            started = time.perf_counter()
            m.received += len(events)
            pending: list[Awaitable] = []
            items, where = [], {}
            for event in events:
                try:
                    kind = names.get(event.message.topic) or kind_of("", names, decode(event.message.value))
                    rec = kind, TOPICS[kind].decode(event.message.value)
                except DecodeError as exc:
                    refuse_invalid(ctx, event, str(exc))
                    continue
                items.append((event, rec))
                where[rec[1]["host"]] = event.message.partition
            result, failed = evaluate_isolating(items, {h: hosts.get(h) for h in where}, config)
            for event, reason in failed:
                await refuse(pending, event, kind_of(event.message.topic, names, None), reason)
            for f in result.faults:
                pending.append(await ctx.emitter.send(faults_topic, f.host.encode(), encode(f)))
                log.info("fault %s %s gpu=%s %s -> %s (%s) count=%d", f.evidence.get("emission"), f.host,
                         f.gpu_index, f.code, f.bin, f.rule, f.count)
            await asyncio.gather(*pending)  # outputs acknowledged before state is written and offsets can commit
            m.emitted += len(result.faults)
            if result.stats["replayed"]:  # after a restart: records the state had already applied
                log.info("skipped %d replayed records", result.stats["replayed"])
            for host, st in result.state.items():
                put(hosts, where[host], host, st.to_json())
            m.observe_batch(time.perf_counter() - started)

    return [app.agent(source, name="fault_bins", concurrency=1)(fault_bins)]
