"""The health faust stage: samples, faults, remediation results and straggler flags in; GPU and node scores out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING

import faust
import orjson
from faust.types import EventT

from core.errors import DecodeError
from schemas.analytics import HealthScore
from schemas.codec import decode, encode
from schemas.topics import FAULTS, HEALTH, HEALTH_STRAGGLERS, REMEDIATION, SAMPLES, STRAGGLERS
from streams.emit import refuse as refuse_record
from streams.emit import refuse_invalid
from streams.health import (HealthConfig, HostHealth, Scores, apply_fault, apply_remediation, apply_sample,
                            apply_straggler, health_config, score)
from streams.state import put

if TYPE_CHECKING:
    from streams.context import StageContext

# Two stages, both concurrency 1:
# - `health.stragglers` (fleet.stragglers, keyed by job) forwards the ranks that are or were recently flagged to the
#   internal topic `<app id>-health-stragglers_by_host`, keyed by host, so they meet the host's state.
# - `health` (samples, faults, remediation results and that internal topic, all keyed by host and co-partitioned)
#   folds each record into the host's state and publishes the rows `news` picks: at 2,048 hosts that is one
#   node row per host per heartbeat (~34/s) plus changes, not one per sample (~400/s).
# Host state reaches the changelog whenever the host publishes a row or takes a fault, flag or repair; between those
# only EWMAs and counter baselines move, so a crash costs at most one heartbeat of smoothing, never a gate.
COMPONENT = "streams.health"
NUMBER = (int, float)
TOPIC_OF = {"sample": SAMPLES, "fault": FAULTS, "result": REMEDIATION}


def _need(obj: Mapping, name: str, types: tuple, *, optional: bool = False) -> None:
    v = obj.get(name)
    if (v is None and optional) or type(v) in types:  # type(): a bool is not a number here
        return
    raise DecodeError(f"{name} {v!r} is not {'/'.join(t.__name__ for t in types)}")


def check_straggler(value: object) -> dict:
    """Lean check of a forwarded straggler standing (an internal record; registry topics have their validators)."""
    if not isinstance(value, dict) or not isinstance(value.get("host"), str) or not value["host"]:
        raise DecodeError("straggler record is not an object with a host")
    for name in ("ts", "slowdown_pct", "z"):
        _need(value, name, NUMBER)
    _need(value, "flagged", (bool,))
    _need(value, "gpu_index", (int,), optional=True)
    return value


def read(event: EventT, names: Mapping[str, str]) -> tuple[str, dict]:
    """(kind, checked record): registry topics through their validator, the forwarded standings by their check."""
    raw = event.message.value
    kind = names.get(event.message.topic) or kind_of("", names, decode(raw))
    return kind, (TOPIC_OF[kind].decode(raw) if kind in TOPIC_OF else check_straggler(decode(raw)))


def kind_of(topic: str, names: Mapping[str, str], value: object) -> str:
    """The record's kind by source topic, else (a test channel) by its shape."""
    if topic in names:
        return names[topic]
    if isinstance(value, dict):
        for key, kind in (("gpus", "sample"), ("fault_id", "fault"), ("event_id", "result")):
            if key in value:
                return kind
    return "straggler"


def news(h: HostHealth, sc: Scores, cfg: HealthConfig) -> list[HealthScore]:
    """The rows worth publishing: a node or GPU whose score moved >= emit_delta or whose gates changed, and every
    node each heartbeat_s (with its GPUs below 100). Rows are built only for these. Updates h.emitted."""
    out: list[HealthScore] = []
    last = h.emitted.get("node")
    beat = last is None or sc.ts - last[2] >= cfg.heartbeat_s

    def moved(prev: list | None, score: float, gates: list[str]) -> bool:
        return prev is None or abs(score - prev[0]) >= cfg.emit_delta or gates != prev[1]

    for i, (score, gates) in enumerate(zip(sc.gpu_score.tolist(), sc.gpu_gates)):
        if moved(h.emitted.get(str(i)), score, gates) or (beat and score < 100):
            out.append(sc.gpu(i))
            h.emitted[str(i)] = [score, gates]
    node_gates = sorted(sc.gates)
    if beat or moved(last, sc.node_score, node_gates):
        out.append(sc.node())
        h.emitted["node"] = [sc.node_score, node_gates, sc.ts]
    return out


def wire(app: faust.App, ctx: StageContext) -> list:
    """Register the straggler forwarder and the health stage, and the host table they feed."""
    s, m = ctx.settings, ctx.metrics
    cfg, p = health_config(s), s.topic_prefix
    raw = dict(key_serializer="raw", value_serializer="raw")
    by_host = HEALTH_STRAGGLERS.full(app.conf.id)
    names = {SAMPLES.full(p): "sample", FAULTS.full(p): "fault", REMEDIATION.full(p): "result", by_host: "straggler"}
    dlq = {"sample": SAMPLES.dlq(p), "fault": FAULTS.dlq(p), "result": REMEDIATION.dlq(p),
           "straggler": STRAGGLERS.dlq(p)}
    out_topic = HEALTH.full(p)
    # internal: faust creates the by-host topic (co-partitioned, 8 partitions); the registry topics already exist.
    source = app.topic(*names, internal=True, partitions=SAMPLES.partitions, replicas=s.streams_replication, **raw)
    hosts = app.Table("health-hosts", partitions=SAMPLES.partitions,
                      help="per-host GPU EWMAs, counter baselines, gates, fault history, straggler flags, last rows")

    async def refuse(pending: list[Awaitable], event: EventT, kind: str, reason: str) -> None:
        await refuse_record(ctx, pending, event, dlq[kind], reason, COMPONENT)

    async def health(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            m.received += len(events)
            pending: list[Awaitable] = []
            states: dict[str, HostHealth] = {}
            where: dict[str, int] = {}
            durable: set[str] = set()
            now: dict[str, float] = {}
            for event in events:
                kind, rec = kind_of(event.message.topic, names, None), {}
                try:
                    kind, rec = read(event, names)
                    host = rec["host"]
                    st = states.get(host) or HostHealth.from_json(hosts.get(host))
                    changed = {"sample": lambda: apply_sample(st, rec, cfg), "fault": lambda: apply_fault(st, rec, cfg),
                               "result": lambda: apply_remediation(st, rec),
                               "straggler": lambda: apply_straggler(st, rec)}[kind]()
                except DecodeError as exc:
                    if kind in TOPIC_OF:
                        refuse_invalid(ctx, event, str(exc))
                    else:
                        await refuse(pending, event, kind, str(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - a record the validator let through: refuse it alone
                    await refuse(pending, event, kind, f"health rules failed: {exc!r}")
                    states.pop(rec.get("host"), None)  # its half-applied state goes; the table keeps the last good
                    continue
                states[host], where[host] = st, event.message.partition
                if changed and kind != "sample":
                    durable.add(host)
                ts = rec["ts"] if kind != "fault" else rec["last_ts"]
                now[host] = max(now.get(host, 0.0), float(ts))
            rows = []
            for host, st in states.items():
                if st.installed == 0:
                    continue  # no sample yet: nothing to score
                out = news(st, score(st, host, max(st.wm, now[host]), cfg), cfg)
                if out:
                    durable.add(host)
                    rows += out
            for row in rows:
                pending.append(await ctx.emitter.send(out_topic, row.host.encode(), encode(row)))
            await asyncio.gather(*pending)  # rows acknowledged before state is written and offsets can commit
            m.emitted += len(rows)
            for host, st in states.items():
                if host in durable:
                    put(hosts, where[host], host, st.to_json())
                else:
                    hosts.data[host] = st.to_json()  # memory only: smoothing, recovered up to one heartbeat old
            m.observe_batch(time.perf_counter() - started)

    async def health_stragglers(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            pending: list[Awaitable] = []
            for event in events:
                try:
                    rec = STRAGGLERS.decode(event.message.value)
                except DecodeError as exc:
                    refuse_invalid(ctx, event, str(exc))
                    continue
                if rec["flagged"] or rec.get("windows_flagged", 0):  # flagged now, or a flag that may just clear
                    fwd = {k: rec.get(k) for k in ("host", "gpu_index", "ts", "flagged", "slowdown_pct", "z", "job",
                                                   "rank")}
                    pending.append(await ctx.emitter.send(by_host, rec["host"].encode(), orjson.dumps(fwd)))
            await asyncio.gather(*pending)

    stragglers = app.topic(STRAGGLERS.full(p), **raw)
    return [app.agent(source, name="health", concurrency=1)(health),
            app.agent(stragglers, name="health.stragglers", concurrency=1)(health_stragglers)]
