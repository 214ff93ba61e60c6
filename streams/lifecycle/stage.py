"""The lifecycle stage's two steps: each node's state machine, and the one fleet-wide step behind the drain breaker.

- The node step (lane `decisions`: node health rows, faults, remediation results, and the breaker's answers on the
  internal topic lifecycle-decisions, all keyed by host) steps each node's state machine, publishes every transition
  to the compacted fleet.node.state and drain/repair/validate/undrain/replace requests to fleet.drain.events, and sends
  drain proposals, validation bandwidths, returns to service, usable-compute shares and the event-time minute clock to
  the fleet step. Its
  lane reads no samples, so a drain decision never waits behind a burst of them.
- The fleet step (lane `fleet`: the internal single-partition topic lifecycle-fleet) is the one place that sees every
  drain: it admits or denies each proposal (the circuit breaker; an NVLink domain's trays failing together as one
  incident, streams/lifecycle/domains.py) and answers on the decisions topic (the node then requests the drain itself,
  so a bot's answer can never overtake the node's own state), publishes the breaker alert and domain pages,
  takes `fleetpulse breaker reset` commands, and reports usable compute per minute on fleet.usable_compute: each node
  as at the minute's end in event time, reported once the clock is minute_lateness_s past it (docs/outcomes.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from core.errors import DecodeError
from schemas.codec import encode
from schemas.topics import (
    ALERTS, DRAIN, FAULTS, HEALTH, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET, NODE_STATE, REMEDIATION, USABLE,
)
from streams.lifecycle import rules as lc
from schemas.analytics import Alert
from streams.lifecycle.breaker import (
    Breaker, BreakerConfig, Verdict, add_busbw, answer, count_once, decide, reset,
)
from streams.lifecycle.cost import drain_cost
from streams.lifecycle.domains import Incident, domain_of
from streams.lifecycle.usable_compute import (
    add_change, changed, fleet_usable, fold, known_nodes, minutes_due, node_share,
)
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step, stage_logger

NODES, FLEET = "nodes", "fleet"
log = stage_logger("lifecycle")
FLEET_KEY = b"fleet"
HANDLERS = {"health": lc.on_health, "fault": lc.on_fault, "result": lc.on_result, "decision": lc.on_decision}
FLEET_KINDS = ("drain", "busbw", "share", "job", "tick", "close", "reset", "back")
NUMBER, HOST = (int, float), ("host", (str,))
SHAPES = {"decision": (("proposal_id", (str,)), ("admitted", (bool,)), ("event_id", (str,))),
          "drain": (HOST, ("proposal_id", (str,)), ("repair", (str,)), ("evidence", (dict,))),
          "busbw": (HOST, ("gbs", NUMBER)), "share": (HOST, ("share", (list,))),
          "job": (HOST, ("job", (str, type(None)))), "back": (HOST,)}


@dataclass(frozen=True)
class LifecycleStageConfig:
    node: lc.LifecycleConfig
    breaker: BreakerConfig


NODE_SETTING = Setting("lifecycle", lc.LifecycleConfig, "node state machine timings")
BREAKER_SETTING = Setting("breaker", BreakerConfig, "drain circuit breaker")


def config(settings) -> LifecycleStageConfig:
    return LifecycleStageConfig(NODE_SETTING.of(settings), BREAKER_SETTING.of(settings))


def _check(value: object, kind: str) -> dict:
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


def check_decision(value: object) -> dict:
    """The breaker's answer to a drain proposal (the stage's own internal record)."""
    return _check(value, "decision")


def check_fleet(value: object) -> dict:
    """A record for the fleet step: share, drain proposal, busbw report, minute tick, close or operator reset."""
    return _check(value, "fleet")


def node_step(records: Sequence[Record], state: State, cfg: LifecycleStageConfig) -> list[Emit]:
    out: list[Emit] = []
    nodes: dict[str, lc.Node] = {}
    fleet: list[dict] = []  # per record: its share, the minute tick, then its proposals and reports (any batches)
    for r in records:
        rec = r.value
        if r.kind == "health" and rec.get("gpu_index") is not None:
            continue  # GPU rows: the node row carries what the node's lifecycle needs
        host = rec["host"]
        n = nodes.get(host) or lc.Node.from_json(state.get(NODES, host))
        job = n.job
        o = HANDLERS[r.kind](n, host, rec, cfg.node)
        nodes[host] = n
        ts = float(rec.get("ts") or rec.get("last_ts"))
        if n.job != job:  # the fleet step keeps every node's job: what a drain of one of them stops
            fleet.append({"kind": "job", "host": host, "ts": ts, "job": n.job})
        share = node_share(n.state, n.inputs, job_runs_on=(n.cause or {}).get("mode") == "after_jobs")
        if n.inputs and changed(n.share, share):
            n.share = share
            fleet.append({"kind": "share", "host": host, "ts": ts, "share": share})
        due = int((ts - cfg.node.minute_lateness_s) // 60)  # the fleet's minute clock moves even when nothing
        if due > state.memo.get("minute", -1):  # changes, when a minute comes due (minute_lateness_s after its end)
            state.memo["minute"] = due
            fleet.append({"kind": "tick", "ts": ts})
        out += [Emit(NODE_STATE, host.encode(), encode(st), f"{host} {st.prev_state} -> {st.state}: {st.reason}")
                for st in o.states]
        out += [Emit(DRAIN, host.encode(), encode(req)) for req in o.requests]
        fleet += o.proposals + o.reports
    for host, n in nodes.items():
        state.put(NODES, host, n.to_json())
    return out + [Emit(LIFECYCLE_FLEET, FLEET_KEY, orjson.dumps(rec)) for rec in fleet]


def _share(state: State, rec: dict) -> None:
    """A node's new share: pending until the minute it happened in is reported, or at once when that minute already
    was (later than minute_lateness_s: it counts from the next report on)."""
    minute, host = state.get(FLEET, "minute"), rec["host"]
    if minute is not None and float(rec["ts"]) < (minute + 1) * 60.0:
        state.put(FLEET, f"share:{host}", rec["share"])
        if state.get(FLEET, f"pending:{host}") is not None:
            state.delete(FLEET, f"pending:{host}")  # the node's newest change: what was pending is superseded
    else:
        state.put(FLEET, f"pending:{host}", add_change(state.get(FLEET, f"pending:{host}", []), float(rec["ts"]),
                                                       rec["share"]))


def _installed(state: State, host: str) -> float:
    """The node's installed GPUs, from its newest share (pending or reported; SHARE-ordered, installed first)."""
    pending = state.get(FLEET, f"pending:{host}")
    share = pending[-1][1] if pending else state.get(FLEET, f"share:{host}")
    return float(share[0]) if share else 0.0


def _fold(state: State, end: float) -> None:
    """Every node's share as at `end`: its pending changes before then applied, the later ones kept."""
    for key, changes in list(state.scan(FLEET, "pending:").items()):
        share, rest = fold(changes, end)
        if share is None:
            continue
        host = key.removeprefix("pending:")
        state.put(FLEET, f"share:{host}", share)
        if rest:
            state.put(FLEET, key, rest)
        else:
            state.delete(FLEET, key)


def _cost(state: State, proposal: dict, cfg: lc.LifecycleConfig) -> dict[str, str]:
    """The drain's blast radius from every node's job and installed GPUs (cost.py)."""
    host = proposal["host"]
    job = state.get(FLEET, f"job:{host}")
    members = [k.removeprefix("job:") for k, j in state.scan(FLEET, "job:").items() if j == job] if job else []
    return drain_cost(proposal["repair"], proposal.get("mode", "immediate"), _installed(state, host), job,
                      {h: _installed(state, h) for h in members}, cfg)


def _fleet_size(state: State) -> int:
    """Nodes the fleet step has heard of, reported or still pending (the breaker's cap is a share of them)."""
    return len(known_nodes([*state.scan(FLEET, "share:"), *state.scan(FLEET, "pending:")]))


def fleet_step(records: Sequence[Record], state: State, cfg: LifecycleStageConfig) -> list[Emit]:
    out: list[Emit] = []
    b = Breaker.from_json(state.get(FLEET, "breaker"))
    touched = False
    for r in records:
        rec, kind = r.value, r.value["kind"]
        # The minute clock runs on event time, minute_lateness_s behind the newest record; an operator's reset
        # carries wall time, so it does not move it; a close (the fleet's clock stopped: `up` at its end) reports
        # every minute before its ts at once.
        due, last = ([], None) if kind == "reset" else \
            minutes_due(state.get(FLEET, "minute"), float(rec["ts"]),
                        lateness_s=0.0 if kind == "close" else cfg.node.minute_lateness_s)
        for m in due:
            _fold(state, (m + 1) * 60.0)
            shares = state.scan(FLEET, "share:")
            if not shares:
                continue  # no node had reported by then (the clock starts minute_lateness_s before its first input)
            uc = fleet_usable(shares.values(), m * 60.0)
            out.append(Emit(USABLE, FLEET_KEY, orjson.dumps(uc)))
            state.put(FLEET, "usable_compute", uc)
        if last is not None and last != state.get(FLEET, "minute"):
            state.put(FLEET, "minute", last)
        if kind == "drain":
            prior = state.get(FLEET, f"decided:{rec['host']}")
            domain = domain_of(rec)
            if domain is not None and not (prior is not None and prior[0] == rec["proposal_id"]):
                v, page = _domain_drain(state, b, rec, prior, domain, cfg)
                out += [Emit(ALERTS, FLEET_KEY, encode(page), page.summary, logging.WARNING)] if page else []
            else:
                v = decide(b, rec, prior, _fleet_size(state), cfg.breaker, _installed(state, rec["host"]))
            state.put(FLEET, f"decided:{rec['host']}", v.decided)
            touched = True
            if v.decision is None:
                continue  # a replayed proposal: answered before
            v.decision["cost"] = _cost(state, rec, cfg.node)
            out.append(Emit(LIFECYCLE_DECISIONS, rec["host"].encode(), orjson.dumps(v.decision),
                            f"drain {rec['proposal_id']} {'admitted' if v.decision['admitted'] else 'denied'}: "
                            f"{v.decision['reason']}"))
            if v.alert is not None:
                out.append(Emit(ALERTS, FLEET_KEY, encode(v.alert), f"circuit breaker open: {b.reason}",
                                logging.WARNING))
        elif kind == "busbw":
            touched = add_busbw(b, rec, cfg.breaker) or touched
        elif kind == "share":
            _share(state, rec)
        elif kind == "job":
            if rec["job"]:
                state.put(FLEET, f"job:{rec['host']}", rec["job"])
            elif state.get(FLEET, f"job:{rec['host']}") is not None:
                state.delete(FLEET, f"job:{rec['host']}")
        elif kind == "back":
            out += [Emit(ALERTS, FLEET_KEY, encode(page), page.summary) for page in _back(state, rec, cfg.node)]
        elif kind == "reset":
            alert = reset(b, rec)
            touched = True
            why = f"circuit breaker reset by {rec.get('by', '?')} ({'closed' if alert else 'was closed'})"
            if alert is None:
                log.warning("%s", why)
            else:
                out.append(Emit(ALERTS, FLEET_KEY, encode(alert), why, logging.WARNING))
    if touched:
        state.put(FLEET, "breaker", b.to_json())
    return out


def _domain_drain(state: State, b: Breaker, rec: dict, prior: list | None, domain: str,
                  cfg: LifecycleStageConfig) -> tuple[Verdict, Alert | None]:
    """A drain proposal for a fault of an NVLink domain (domains.py): joined to the domain's open incident without the
    breaker, or decided by it; the domain_min_hosts-th tray admitted within the window opens the incident (its page,
    and one breaker entry for it)."""
    host, ts, node = rec["host"], float(rec["ts"]), cfg.node
    inc = Incident.from_json(state.get(FLEET, f"domain:{domain}"))
    if inc is None or (not inc.open and ts - inc.since > node.domain_window_s):
        inc = Incident(domain, ts)
    page = None
    if inc.open:
        inc.add(host, rec["evidence"]["code"])
        v = answer(b, rec, True, f"part of NVLink domain {domain}'s incident since {inc.since:.0f} ({len(inc.hosts)} "
                                 f"trays): admitted with it, not counted again by the breaker")
    else:
        v = decide(b, rec, prior, _fleet_size(state), cfg.breaker, _installed(state, host))
        if v.decision is not None and v.decision["admitted"]:
            inc.add(host, rec["evidence"]["code"])
            if len(inc.hosts) >= node.domain_min_hosts:
                inc.open = True
                count_once(b, inc.hosts)
                page = inc.page("firing", ts, node.domain_min_hosts, node.domain_window_s)
    if inc.open and v.decision is not None:
        v.decision.update(incident=domain, incident_since=f"{inc.since:.0f}", incident_hosts=str(len(inc.hosts)))
    if inc.hosts:
        state.put(FLEET, f"domain:{domain}", inc.to_json())
    return v, page


def _back(state: State, rec: dict, cfg: lc.LifecycleConfig) -> list[Alert]:
    """A node validated back into service: an open incident all of whose trays are back ends, its page resolved."""
    out = []
    for key, raw in list(state.scan(FLEET, "domain:").items()):
        inc = Incident.from_json(raw)
        if rec["host"] not in inc.hosts or rec["host"] in inc.back:
            continue
        inc.back.append(rec["host"])
        if len(inc.back) < len(inc.hosts):
            state.put(FLEET, key, inc.to_json())
            continue
        state.delete(FLEET, key)
        if inc.open:
            out.append(inc.page("resolved", float(rec["ts"]), cfg.domain_min_hosts, cfg.domain_window_s))
    return out


STAGE = StageSpec(
    name="lifecycle",
    description="node state machine, fleet-wide drain breaker, repair/validate loop, usable compute per minute",
    steps=(Step("decisions", (Input(HEALTH, "health"), Input(FAULTS, "fault"), Input(REMEDIATION, "result"),
                              Input(LIFECYCLE_DECISIONS, "decision", check_decision)), node_step,
                batch_within_s=lambda cfg: cfg.node.batch_within_s),
           Step("fleet", (Input(LIFECYCLE_FLEET, "fleet", check_fleet),), fleet_step,
                batch_within_s=lambda cfg: cfg.node.batch_within_s)),
    outputs=(NODE_STATE, DRAIN, ALERTS, USABLE, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET),
    tables=(StateTable(NODES, "per-node lifecycle record (by host)"),
            StateTable(FLEET, "breaker, decisions, usable-compute shares (one key space)", partitions=1)),
    config=config,
    settings=(NODE_SETTING, BREAKER_SETTING),
    worker="decisions",  # a fault -> proposal -> breaker -> drain chain that never queues behind samples
)
