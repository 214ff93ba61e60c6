"""The node lifecycle faust stage: health, faults and remediation results drive each node; one step sees the fleet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING

import faust
import orjson
from faust.types import EventT

from core.errors import DecodeError
from schemas.codec import decode, encode
from schemas.topics import (
    ALERTS, DRAIN, FAULTS, HEALTH, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET, NODE_STATE, REMEDIATION, USABLE,
)
from streams import lifecycle as lc
from streams.breaker import Breaker, add_busbw, breaker_config, decide, reset
from streams.emit import refuse as refuse_record
from streams.emit import refuse_invalid
from streams.state import put
from streams.usable_compute import changed, fleet_usable, minutes_due, node_share

if TYPE_CHECKING:
    from streams.context import StageContext

# Two stages, both concurrency 1:
# - `lifecycle` (fleet.health.scores node rows, fleet.faults, fleet.remediation.results and the internal topic
#   `<app id>-lifecycle-decisions`, all keyed by host and co-partitioned) steps each node's state machine, publishes
#   every transition to the compacted fleet.node.state and drain/repair/validate/undrain/replace requests to
#   fleet.drain.events, and sends drain proposals, validation bandwidths and usable-compute shares to the fleet step.
# - `lifecycle.fleet` (the internal single-partition topic `<app id>-lifecycle-fleet`, one key) is the one place that
#   sees every drain: it admits or denies each proposal (the circuit breaker) and answers on the decisions topic (the
#   node then requests the drain itself, so a bot's answer can never overtake the node's own state), publishes the
#   breaker alert, takes `fleetpulse breaker reset` commands, and reports usable compute per minute on
#   fleet.usable_compute.
COMPONENT = "streams.lifecycle"
FLEET_KEY = b"fleet"
HANDLERS = {"health": lc.on_health, "fault": lc.on_fault, "result": lc.on_result, "decision": lc.on_decision}
FLEET_KINDS = ("drain", "busbw", "share", "tick", "reset")
NUMBER, HOST = (int, float), ("host", (str,))
TOPIC_OF = {"health": HEALTH, "fault": FAULTS, "result": REMEDIATION}
SHAPES = {"decision": (("proposal_id", (str,)), ("admitted", (bool,)), ("event_id", (str,))),
          "drain": (HOST, ("proposal_id", (str,)), ("repair", (str,)), ("evidence", (dict,))),
          "busbw": (HOST, ("gbs", NUMBER)), "share": (HOST, ("share", (list,)))}


def fleet_topic(app_id: str) -> str:
    """The breaker's single-partition input; `fleetpulse breaker reset` writes here too."""
    return LIFECYCLE_FLEET.full(app_id)


def check(value: object, kind: str) -> dict:
    """Lean shape check of one of the stage's internal records (a decision, a fleet record); registry topics have their
    validators. DecodeError for anything the state machines cannot read."""
    if not isinstance(value, dict) or not isinstance(value.get("host" if kind != "fleet" else "kind"), str):
        raise DecodeError(f"{kind} record is not an object with a {'host' if kind != 'fleet' else 'kind'}")
    if type(value.get("ts")) not in (int, float):
        raise DecodeError(f"{kind} record ts {value.get('ts')!r} is not a number")
    if kind == "fleet" and value["kind"] not in FLEET_KINDS:
        raise DecodeError(f"fleet record kind {value['kind']!r} is not one of {FLEET_KINDS}")
    for name, types in SHAPES.get(value["kind"] if kind == "fleet" else kind, ()):
        if type(value.get(name)) not in types:
            raise DecodeError(f"{kind} {name} {value.get(name)!r} is not {types[0].__name__}")
    return value


def kind_of(topic: str, names: Mapping[str, str], value: object) -> str:
    """The record's kind by source topic, else (a test channel) by its shape."""
    if topic in names:
        return names[topic]
    if isinstance(value, dict):
        for key, kind in (("score", "health"), ("fault_id", "fault"), ("proposal_id", "decision")):
            if key in value:
                return kind
    return "result"


def wire(app: faust.App, ctx: StageContext) -> list:
    """Register the node stage, the fleet step, their tables and internal topics."""
    s, m, log = ctx.settings, ctx.metrics, ctx.log
    cfg, bcfg, p = lc.lifecycle_config(s), breaker_config(s), s.topic_prefix
    raw = dict(key_serializer="raw", value_serializer="raw")
    fleet_name, decisions = fleet_topic(app.conf.id), LIFECYCLE_DECISIONS.full(app.conf.id)
    usable_name = USABLE.full(p)
    names = {HEALTH.full(p): "health", FAULTS.full(p): "fault", REMEDIATION.full(p): "result", decisions: "decision"}
    dlq = {"health": HEALTH.dlq(p), "fault": FAULTS.dlq(p), "result": REMEDIATION.dlq(p), "decision": DRAIN.dlq(p),
           "fleet": DRAIN.dlq(p)}  # our own internal records: their refusals go with the drain events
    state_topic, drain_topic, alerts_topic = NODE_STATE.full(p), DRAIN.full(p), ALERTS.full(p)
    source = app.topic(*names, internal=True, partitions=HEALTH.partitions, replicas=s.streams_replication, **raw)
    fleet_in = app.topic(fleet_name, internal=True, partitions=1, replicas=s.streams_replication, **raw)
    nodes = app.Table("lifecycle-nodes", partitions=HEALTH.partitions, help="per-node lifecycle record (by host)")
    fleet = app.Table("lifecycle-fleet", partitions=1, help="breaker, decisions, usable-compute shares (one key space)")
    last_tick = [0]

    async def refuse(pending: list[Awaitable], event: EventT, kind: str, reason: str) -> None:
        await refuse_record(ctx, pending, event, dlq[kind], reason, COMPONENT)

    async def send(pending: list[Awaitable], topic: str, key: bytes, value: bytes) -> None:
        pending.append(await ctx.emitter.send(topic, key, value))

    async def lifecycle(stream):
        async for events in stream.take_events(s.streams_batch_max, within=cfg.batch_within_s):
            started = time.perf_counter()
            m.received += len(events)
            pending: list[Awaitable] = []
            touched: dict[str, tuple[lc.Node, int]] = {}
            outs: list[tuple[str, lc.Out]] = []
            to_fleet: list[dict] = []
            for event in events:
                kind, raw = kind_of(event.message.topic, names, None), event.message.value
                try:
                    kind = names.get(event.message.topic) or kind_of("", names, decode(raw))
                    rec = TOPIC_OF[kind].decode(raw) if kind in TOPIC_OF else check(decode(raw), kind)
                except DecodeError as exc:
                    if kind in TOPIC_OF:
                        refuse_invalid(ctx, event, str(exc))
                    else:
                        await refuse(pending, event, kind, str(exc))
                    continue
                if kind == "health" and rec.get("gpu_index") is not None:
                    continue  # GPU rows: the node row carries what the node's lifecycle needs
                host = rec["host"]
                n = touched[host][0] if host in touched else lc.Node.from_json(nodes.get(host))
                before = n.to_json()
                try:
                    out = HANDLERS[kind](n, host, rec, cfg)
                except Exception as exc:  # noqa: BLE001 - a record the lean check let through: refuse it alone
                    await refuse(pending, event, kind, f"lifecycle rules failed: {exc!r}")
                    touched[host] = (lc.Node.from_json(before), event.message.partition)
                    continue
                touched[host] = (n, event.message.partition)
                outs.append((host, out))
                ts = float(rec.get("ts") or rec.get("last_ts"))
                share = node_share(n.state, n.inputs)
                if n.inputs and changed(n.share, share):
                    n.share = share
                    to_fleet.append({"kind": "share", "host": host, "ts": ts, "share": share})
                if int(ts // 60) > last_tick[0]:  # the fleet's minute clock advances even when nothing changes
                    last_tick[0] = int(ts // 60)
                    to_fleet.append({"kind": "tick", "ts": ts})
            for host, out in outs:
                for st in out.states:
                    await send(pending, state_topic, host.encode(), encode(st))
                    log.info("%s %s -> %s: %s", host, st.prev_state, st.state, st.reason)
                for req in out.requests:
                    await send(pending, drain_topic, host.encode(), encode(req))
                to_fleet += out.proposals + out.reports
                m.emitted += len(out.states) + len(out.requests)
            for rec in to_fleet:
                await send(pending, fleet_name, FLEET_KEY, orjson.dumps(rec))
            await asyncio.gather(*pending)  # outputs acknowledged before state is written and offsets can commit
            for host, (n, partition) in touched.items():
                put(nodes, partition, host, n.to_json())
            m.observe_batch(time.perf_counter() - started)

    async def lifecycle_fleet(stream):
        async for events in stream.take_events(s.streams_batch_max, within=cfg.batch_within_s):
            started = time.perf_counter()
            pending: list[Awaitable] = []
            dirty: set[str] = set()
            b = Breaker.from_json(fleet.get("breaker"))

            def keep(key: str, value) -> None:  # memory now, changelog once the batch's outputs are acknowledged
                fleet.data[key] = value
                dirty.add(key)

            for event in events:
                try:
                    rec = check(decode(event.message.value), "fleet")
                except DecodeError as exc:
                    await refuse(pending, event, "fleet", str(exc))
                    continue
                kind = rec["kind"]
                # The minute clock runs on event time; an operator's reset carries wall time, so it does not move it.
                due, last = minutes_due(fleet.get("minute"), float(rec["ts"])) if kind != "reset" else ([], None)
                for minute in due:
                    uc = fleet_usable((v for k, v in fleet.data.items() if k.startswith("share:")), minute * 60.0)
                    await send(pending, usable_name, FLEET_KEY, orjson.dumps(uc))
                    keep("usable_compute", uc)
                if last is not None and last != fleet.get("minute"):
                    keep("minute", last)
                if kind == "drain":
                    known = sum(1 for k in fleet.data.keys() if k.startswith("share:"))
                    v = decide(b, rec, fleet.get(f"decided:{rec['host']}"), known, bcfg)
                    keep(f"decided:{rec['host']}", v.decided)
                    dirty.add("breaker")
                    if v.decision is None:
                        continue  # a replayed proposal: answered before
                    await send(pending, decisions, rec["host"].encode(), orjson.dumps(v.decision))
                    log.info("drain %s %s: %s", rec["proposal_id"], "admitted" if v.decision["admitted"] else "denied",
                             v.decision["reason"])
                    if v.alert is not None:
                        await send(pending, alerts_topic, FLEET_KEY, encode(v.alert))
                        log.warning("circuit breaker open: %s", b.reason)
                elif kind == "busbw" and add_busbw(b, rec, bcfg):
                    dirty.add("breaker")
                elif kind == "share":
                    keep(f"share:{rec['host']}", rec["share"])
                elif kind == "reset":
                    alert = reset(b, rec)
                    dirty.add("breaker")
                    log.warning("circuit breaker reset by %s (%s)", rec.get("by", "?"),
                                "closed" if alert else "was closed")
                    if alert is not None:
                        await send(pending, alerts_topic, FLEET_KEY, encode(alert))
            await asyncio.gather(*pending)
            if "breaker" in dirty:
                fleet.data["breaker"] = b.to_json()
            for key in dirty:
                put(fleet, 0, key, fleet.data[key])
            m.observe_batch(time.perf_counter() - started)
    return [app.agent(source, name="lifecycle", concurrency=1)(lifecycle),
            app.agent(fleet_in, name="lifecycle.fleet", concurrency=1)(lifecycle_fleet)]
