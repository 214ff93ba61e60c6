"""The power/thermal faust stage: host samples in, alerts out, alert state in changelog tables by host and rack."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

import faust
import orjson
from faust.types import EventT

from core.errors import DecodeError
from schemas.codec import encode
from schemas.topics import ALERTS, RACK_POWER, SAMPLES
from streams.emit import refuse as refuse_record
from streams.emit import refuse_invalid
from streams.power_thermal import Config, Evaluation, RackReport, SubjectState, evaluate
from streams.rack_power import RackConfig, RackState, evaluate_racks
from streams.state import put

if TYPE_CHECKING:
    from streams.context import StageContext

COMPONENT = "streams.power_thermal"


def evaluate_isolating(items: Sequence[tuple[EventT, dict]], prior: dict, config: Config):
    """Evaluate a batch; if the rules raise, redo it record by record so only the offending records are refused."""
    try:
        return evaluate([s for _, s in items], prior, config), []
    except Exception:  # noqa: BLE001 - a record the lean shape check let through; isolate it below
        merged, state, failed = Evaluation([], {}, []), dict(prior), []
        for event, sample in items:
            try:
                one = evaluate([sample], state, config)
            except Exception as exc:  # noqa: BLE001
                failed.append((event, f"power_thermal rules failed: {exc!r}"))
                continue
            merged.alerts += one.alerts
            merged.rack_reports += one.rack_reports
            merged.state.update(one.state)
            state.update(one.state)
        return merged, failed


def wire(app: faust.App, ctx: StageContext) -> list:
    """Register the host stage (and, when rack budgets are configured, the rack stage) on the app."""
    s = ctx.settings
    budgets = s.rack_budgets()
    config = Config(rack_budgets_w=budgets)
    rack_config = RackConfig(budgets_w=budgets)
    alerts_topic, dlq_topic = ALERTS.full(s.topic_prefix), SAMPLES.dlq(s.topic_prefix)
    rack_topic_name = RACK_POWER.full(app.conf.id)
    samples = app.topic(SAMPLES.full(s.topic_prefix), key_serializer="raw", value_serializer="raw")
    # Keys and values are JSON in the changelog (faust's table default when no key/value type is given).
    hosts = app.Table("power_thermal-hosts", partitions=SAMPLES.partitions,
                      help="per-host GPU alert state (keyed by host, like the samples)")
    racks = app.Table("power_thermal-racks", partitions=SAMPLES.partitions,
                      help="per-rack host power and rack alert state") if budgets else None
    m, log = ctx.metrics, ctx.log

    async def finish(pending: list[Awaitable], alerts: list) -> None:
        for a in alerts:
            pending.append(await ctx.emitter.send(alerts_topic, (a.host or a.rack).encode(), encode(a)))
            log.info("%s %s %s gpu=%s value=%.1f threshold=%.1f", a.status, a.alertname, a.host or a.rack,
                     a.gpu_index, a.value, a.threshold)
        await asyncio.gather(*pending)  # outputs acknowledged before state is written and offsets can commit
        m.emitted += len(alerts)

    async def refuse(pending: list[Awaitable], event: EventT, reason: str) -> None:
        await refuse_record(ctx, pending, event, dlq_topic, reason, COMPONENT)

    async def power_thermal(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            m.received += len(events)
            pending: list[Awaitable] = []
            items, where = [], {}
            for event in events:
                try:
                    sample = SAMPLES.decode(event.message.value)
                except DecodeError as exc:
                    refuse_invalid(ctx, event, str(exc))
                    continue
                items.append((event, sample))
                where[sample["host"]] = event.message.partition
            prior = {h: SubjectState.from_json(hosts.get(h)) for h in where}
            result, failed = evaluate_isolating(items, prior, config)
            for event, reason in failed:
                await refuse(pending, event, reason)
            for rep in result.rack_reports:
                pending.append(await ctx.emitter.send(rack_topic_name, rep.rack.encode(),
                                                      orjson.dumps(dataclasses.asdict(rep))))
            await finish(pending, result.alerts)
            for host, st in result.state.items():
                put(hosts, where[host], host, st.to_json())
            m.observe_batch(time.perf_counter() - started)

    async def power_thermal_racks(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            pending: list[Awaitable] = []
            reports, where = [], {}
            for event in events:
                try:
                    rep = RackReport(**orjson.loads(event.message.value))
                except (orjson.JSONDecodeError, TypeError) as exc:
                    await refuse(pending, event, f"bad rack power report: {exc}")
                    continue
                reports.append(rep)
                where[rep.rack] = event.message.partition
            prior = {r: RackState.from_json(racks.get(r)) for r in where}
            alerts, changed = evaluate_racks(reports, prior, rack_config)
            await finish(pending, alerts)
            for rack, st in changed.items():
                put(racks, where[rack], rack, st.to_json())
            m.observe_batch(time.perf_counter() - started)

    agents = [app.agent(samples, name="power_thermal", concurrency=1)(power_thermal)]
    if budgets:
        rack_topic = app.topic(rack_topic_name, internal=True, partitions=SAMPLES.partitions,
                               replicas=s.streams_replication, key_serializer="raw", value_serializer="raw")
        agents.append(app.agent(rack_topic, name="power_thermal.racks", concurrency=1)(power_thermal_racks))
    return agents
