"""Node lifecycle state machine: health hysteresis and dwell, drains, and remediation results back to service."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from schemas.analytics import DrainEvent, NodeState

HEALTHY, SUSPECT, DRAIN_REQUESTED, DRAINED = "healthy", "suspect", "drain_requested", "drained"
REPAIRING, VALIDATING, REPLACE = "repairing", "validating", "replace"
SCHEDULABLE = (HEALTHY, SUSPECT)
EXPECTS = {DRAIN_REQUESTED: "drain", REPAIRING: "repair", VALIDATING: "validate", REPLACE: "replace"}
REPAIRS = ("reset", "reboot", "inspect", "replace")  # mildest first, as FaultBin
GATE_REPAIR = {"ecc_dbe": "reset", "row_remap_pending": "reset", "row_remap_failure": "replace",
               "retired_pages_pending": "reset", "gpu_lost": "reboot", "recovery_action:node_reboot": "reboot",
               "recovery_action:system_reboot": "reboot"}  # other recovery actions: a GPU reset


class LifecycleConfig(BaseModel):
    """Thresholds and dwell times. Sources: ALGORITHMS.md 4.2-4.4 (drain below 60, dwell of two check cycles for
    soft signals and none for hard gates, r2/r3/r4 validation ladder); the rest [ours]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suspect_below: float = Field(default=60.0, description="score under which a node becomes suspect")
    healthy_above: float = Field(default=75.0, description="score over which a suspect node recovers")
    enter_dwell_s: float = Field(default=120.0, description="score held below suspect_below this long -> suspect")
    exit_dwell_s: float = Field(default=300.0, description="score held above healthy_above this long -> healthy")
    min_dwell_s: float = Field(default=600.0, description="least time in healthy or suspect before a soft move")
    drain_dwell_s: float = Field(default=600.0, description="one continuous episode below suspect_below this long "
                                 "while suspect -> drain (inspect)")
    low_share_inspect: float = Field(default=0.75, gt=0, le=1, description=(
        "a node whose score was below suspect_below for more than this share of low_share_window_s, in episodes "
        "however short (a GPU that keeps crossing a limit), is drained for inspection"))
    low_share_window_s: float = Field(default=3600.0, gt=0, le=86_400)
    max_gap_s: float = Field(default=180.0, description="a longer silence between scores counts toward no dwell")
    drain_bins: tuple[str, ...] = ("reset", "reboot", "inspect", "replace")  # retry/ignore never drain
    repropose_s: float = Field(default=60.0, description="wait before asking again after a denied drain")
    request_timeout_s: dict[str, float] = Field(  # re-send a request nobody answered (r4 + burn-in: days)
        default_factory=lambda: {"drain": 3600.0, "repair": 4 * 3600.0, "validate": 4 * 3600.0,
                                 "replace": 14 * 86_400.0})
    retry_s: float = Field(default=120.0, description="re-send a failed drain/repair/replace after this")
    max_repair_failures: int = Field(default=2, ge=1)
    max_validation_failures: int = Field(default=2, ge=1, description="R: failed validations before replace")
    max_cycles: int = Field(default=3, ge=2, description="K: the K-th drain for the same repair within "
                            "cycles_window_s goes to replace instead of another cycle")
    cycles_window_s: float = Field(default=7 * 86_400.0, gt=0, description="window of the recurrence rule")
    dcgm_level: dict[str, int] = Field(default_factory=lambda: {"reboot": 2, "reset": 3, "inspect": 3, "replace": 4})
    nccl_share: float = Field(default=0.9, gt=0, le=1, description="of the fleet median validation bus bandwidth")
    nccl_min_samples: int = Field(default=5, ge=1, description="validations before the fleet median is trusted")
    nccl_floor_gbs: float = Field(default=0.0, ge=0, description="bus bandwidth required before that; 0 = none")
    faults_kept: int = 32
    # What a drain costs (streams/lifecycle/cost.py), [ours] until a fleet's own repair times replace them: the
    # node's GPUs out for the repair's expected time; a drain at once stops the node's job, whose GPUs all lose the
    # restart and, on average, half a checkpoint interval of work. A drain after the job stops nothing.
    repair_hours: dict[str, float] = Field(
        default_factory=lambda: {"reset": 0.5, "reboot": 1.0, "inspect": 24.0, "replace": 72.0},
        description="expected hours out of service per repair kind")
    job_restart_s: float = Field(default=600.0, ge=0, description="a stopped job's restart from its checkpoint")
    checkpoint_interval_s: float = Field(default=3600.0, ge=0, description="between a job's checkpoints: a job "
                                         "stopped at a random moment loses half of it")
    domain_min_hosts: int = Field(default=2, ge=2, description=(
        "trays of one NVLink domain admitted for link or fabric faults within domain_window_s: one incident of the "
        "domain (one page, one breaker entry; later trays join it), streams/lifecycle/domains.py"))
    domain_window_s: float = Field(default=600.0, gt=0, le=86_400)
    batch_within_s: float = Field(default=0.05, gt=0, le=5, description="XID -> drain request: 2 s p95 budget")
    minute_lateness_s: float = Field(default=30.0, ge=0, le=3600, description=(
        "usable compute for a minute is reported once the fleet's event clock is this far past its end, so a drain "
        "or return decided after later records arrived (the breaker's round trip, a lagging worker) counts in its "
        "own minute; raise it where event time runs ahead of the worker (a replay: evaluations use 120 s)"))


@dataclass
class Node:
    """One node's durable lifecycle record (the changelog value)."""

    state: str = HEALTHY
    since: float = 0.0
    initial: bool = True  # never moved: no dwell holds it
    returned_at: float = 0.0  # last validated return; faults older than this were dealt with
    repaired_at: float = 0.0  # last completed repair or replacement; gates that fired before it were dealt with
    gates: dict[str, float] = field(default_factory=dict)  # the latest health row's gates, with their onsets
    score: float = 100.0
    score_ts: float = 0.0
    low_since: float | None = None
    high_since: float | None = None
    below_s: float = 0.0  # the current continuous episode below suspect_below while suspect
    low_log: list[list[float]] = field(default_factory=list)  # [start, end] below suspect_below, low_share_window_s
    episode: int = 0
    asks: int = 0  # drain proposals made (ids)
    sent: int = 0  # requests sent (ids)
    cause: dict | None = None  # {"repair", "mode", "reason", "evidence"}
    proposal: dict | None = None  # {"id", "ts", "cause"} awaiting the breaker
    denied_at: float | None = None
    request: dict | None = None  # {"action", "event_id", "ts", "attempt", "requirements", "due"}
    repair_failures: int = 0
    validation_failures: int = 0
    faults: list[str] = field(default_factory=list)
    returns: list[list] = field(default_factory=list)  # [ts, repair] of each validated return (the recurrence rule)
    busbw: list[float] = field(default_factory=lambda: [0.0, 0])  # fleet median and its count, from the breaker
    inputs: dict[str, float] = field(default_factory=dict)  # latest health inputs (usable compute)
    job: str | None = None  # the job its latest health row names (told to the fleet step: a drain's cost)
    share: list[float] = field(default_factory=list)  # usable-compute share last told to the fleet

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping | None) -> Node:
        if not raw:
            return cls()
        raw = copy.deepcopy(dict(raw))  # never alias the table's value
        raw.setdefault("repaired_at", raw.get("returned_at", 0.0))  # a record from before repaired_at was kept
        # A field a later version added is left out, so a rolled-back worker still reads the changelog it wrote.
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


@dataclass
class Out:
    states: list[NodeState] = field(default_factory=list)
    requests: list[DrainEvent] = field(default_factory=list)
    proposals: list[dict] = field(default_factory=list)  # drain proposals for the fleet-wide breaker
    reports: list[dict] = field(default_factory=list)  # validation bus bandwidth for the fleet median


def _evidence(values: Mapping) -> dict[str, str]:
    return {str(k): str(v)[:240] for k, v in values.items()}


def _go(n: Node, host: str, to: str, ts: float, reason: str, evidence: Mapping, out: Out) -> None:
    prev, ts = n.state, max(ts, n.since)
    n.state, n.since, n.initial = to, ts, False
    n.low_since = n.high_since = None
    n.below_s = 0.0
    if to not in SCHEDULABLE:
        n.low_log = []  # out of service: what comes back is measured afresh
    out.states.append(NodeState(host=host, state=to, prev_state=prev, since=ts, ts=ts, schedulable=to in SCHEDULABLE,
                                reason=reason, evidence=_evidence(evidence)))


def _request(n: Node, host: str, action: str, ts: float, reason: str, cfg: LifecycleConfig, out: Out, *,
             attempt: int = 1, requirements: Mapping | None = None, resend_of: str = "") -> None:
    n.sent += 1
    event_id = f"{host}:{n.episode}:{action}:{n.sent}"
    req = dict(requirements or {})
    n.request = {"action": action, "event_id": event_id, "ts": ts, "attempt": attempt, "requirements": req,
                 "due": ts + cfg.request_timeout_s.get(action, 3600.0)}
    out.requests.append(DrainEvent(event_id=event_id, host=host, action=action, ts=ts, reason=reason,
                                   evidence=_evidence({**(n.cause or {}).get("evidence", {}), **_what(n.cause),
                                                       "attempt": attempt,
                                                       **({"resend_of": resend_of} if resend_of else {})}),
                                   requirements=req))


def _what(cause: dict | None) -> dict[str, str]:
    """The repair a request belongs to (reset, reboot, inspect, replace) and how urgent (immediate, after_jobs): what a
    bot acts on, so it never has to read it out of the reason text."""
    return {k: cause[k] for k in ("repair", "mode") if cause and k in cause}


def requirements(n: Node, cfg: LifecycleConfig) -> dict[str, float]:
    """What validation must show: a DCGM diag level by repair kind, and NCCL bus bandwidth vs the fleet median."""
    repair = (n.cause or {}).get("repair", "inspect")
    req: dict[str, float] = {"dcgm_diag_level": float(cfg.dcgm_level.get(repair, 3))}
    median, count = n.busbw
    if median > 0 and count >= cfg.nccl_min_samples:
        req["nccl_busbw_min_gbs"] = round(cfg.nccl_share * median, 2)
    elif cfg.nccl_floor_gbs > 0:
        req["nccl_busbw_min_gbs"] = cfg.nccl_floor_gbs
    return req


def check(req: Mapping[str, float], result: Mapping) -> str | None:
    """None when a validation result meets every requirement, else why not."""
    if not result["ok"]:
        return f"validation failed: {result.get('detail') or 'no detail'}"
    got = result.get("measurements") or {}
    for name, measured in (("dcgm_diag_level", "dcgm_diag_level"), ("nccl_busbw_min_gbs", "nccl_busbw_gbs")):
        if name in req and got.get(measured, -1.0) < req[name]:
            return f"{measured} {got.get(measured, 'missing')} below required {req[name]:g}"
    return None


def _worse(a: dict | None, b: dict) -> dict:
    """The cause that asks for more: the heavier repair, and at once if either is (a suspect's drain after the job
    becomes a drain now when the GPU then fails hard)."""
    if a is None:
        return b
    worse, other = (b, a) if REPAIRS.index(b["repair"]) > REPAIRS.index(a["repair"]) else (a, b)
    if worse.get("mode") == "after_jobs" and other.get("mode", "immediate") == "immediate":
        worse = {**worse, "mode": "immediate", "reason": f"{other['reason']}; {worse['reason']}"}
    return worse


def _propose(n: Node, host: str, ts: float, cause: dict, cfg: LifecycleConfig, out: Out) -> None:
    """Ask the fleet-wide breaker to admit a drain: one question at a time (its answer always comes: Kafka), and
    again no sooner than repropose_s after a denial."""
    if n.proposal is not None:
        n.proposal["cause"] = _worse(n.proposal["cause"], cause)
        return
    if n.denied_at is not None and ts - n.denied_at < cfg.repropose_s:
        return
    n.asks += 1
    n.proposal = {"id": f"{host}:{n.episode + 1}:p{n.asks}", "ts": ts, "cause": cause}
    out.proposals.append({"kind": "drain", "proposal_id": n.proposal["id"], "host": host, "ts": ts, **cause})


def _tick(n: Node, host: str, ts: float, cfg: LifecycleConfig, out: Out) -> None:
    """Re-send a request that is due: unanswered for request_timeout_s, or failed retry_s ago."""
    r = n.request
    if r is not None and n.state in EXPECTS and ts >= r["due"]:
        _request(n, host, r["action"], ts, f"re-sent: no success since {r['ts']:.0f}", cfg, out,
                 attempt=r["attempt"] + 1, requirements=r["requirements"], resend_of=r["event_id"])


def _since_repair(n: Node) -> dict[str, float]:
    """The gates of the node's latest health row that fired after its last repair: not dealt with by it. Older ones
    were (health restarts a gate's onset at a repair, so one that is still there shows a newer onset)."""
    return {g: t for g, t in n.gates.items() if t >= n.repaired_at}


def on_health(n: Node, host: str, row: Mapping, cfg: LifecycleConfig) -> Out:
    """A node health score: hard gates newer than the last return propose a drain; the score drives hysteresis."""
    out, ts, score = Out(), float(row["ts"]), float(row["score"])
    if ts <= n.score_ts:
        return out
    _tick(n, host, ts, cfg, out)
    inputs = row.get("inputs") or {}
    n.inputs = {k: v for k, v in inputs.items() if not k.startswith("gate_since.")}
    n.job = row.get("job")
    n.inputs["gated"] = float(bool(row["gates"]))
    dt = ts - n.score_ts if n.score_ts and ts - n.score_ts <= cfg.max_gap_s else 0.0
    if n.score < cfg.suspect_below and n.state == SUSPECT:
        n.below_s = n.below_s + dt if dt else 0.0  # a silence longer than max_gap_s ends the episode too
    if n.score < cfg.suspect_below and dt and n.state in SCHEDULABLE:  # out of service: what it was drained for
        n.low_log = _log_low(n.low_log, n.score_ts, ts, cfg.low_share_window_s)
    if score < cfg.suspect_below:
        n.low_since = n.low_since if n.low_since is not None and dt else ts
    else:
        n.low_since, n.below_s = None, 0.0  # the episode is over: the drain dwell measures one, not a sum of them
    if score > cfg.healthy_above:
        n.high_since = n.high_since if n.high_since is not None and dt else ts
    else:
        n.high_since = None
    n.score, n.score_ts = score, ts
    n.gates = {g: float(inputs.get(f"gate_since.{g}", ts)) for g in row["gates"]}
    if n.state not in SCHEDULABLE:
        return out
    fresh = _since_repair(n)  # drains the node again even if it was validated since (the row came after the result)
    dwelt = n.initial or ts - n.since >= cfg.min_dwell_s
    if fresh:
        kinds = [g.rsplit("/", 1)[-1] for g in fresh]
        repair = max((k.split(":", 1)[1] if k.startswith("fault_bin:") else GATE_REPAIR.get(k, "reset")
                      for k in kinds), key=REPAIRS.index)
        gated = ", ".join(sorted(fresh))
        _propose(n, host, ts, {"repair": repair, "mode": "immediate", "reason": f"hard gate: {gated}",
                               "evidence": {"gates": gated, "score": score}}, cfg, out)
    elif n.proposal is None and (low_s := _low_s(n.low_log, ts, cfg.low_share_window_s)) > \
            cfg.low_share_inspect * cfg.low_share_window_s:  # never instead of a pending drain's own cause
        minutes = cfg.low_share_window_s / 60
        _propose(n, host, ts, {"repair": "inspect", "mode": "after_jobs",
                               "reason": f"score below {cfg.suspect_below:g} for {low_s:.0f}s of the last {minutes:g} "
                                         f"min in {len(n.low_log)} episodes (more than "
                                         f"{cfg.low_share_inspect:.0%}): a recurring problem",
                               "evidence": {"score": score, "low_s": round(low_s), "episodes": len(n.low_log),
                                            "window_s": cfg.low_share_window_s, "share": cfg.low_share_inspect,
                                            "penalties": _penalties(row)}}, cfg, out)
    elif n.state == HEALTHY and n.low_since is not None and ts - n.low_since >= cfg.enter_dwell_s and dwelt:
        _go(n, host, SUSPECT, ts, f"score {score:g} below {cfg.suspect_below:g} for {ts - n.low_since:.0f}s",
            {"score": score, "penalties": _penalties(row)}, out)
    elif n.state == SUSPECT and n.proposal is None:
        if n.high_since is not None and ts - n.high_since >= cfg.exit_dwell_s and dwelt:
            n.denied_at = None
            _go(n, host, HEALTHY, ts, f"score {score:g} above {cfg.healthy_above:g} for {ts - n.high_since:.0f}s",
                {"score": score}, out)
        elif n.below_s >= cfg.drain_dwell_s and dwelt:
            _propose(n, host, ts, {"repair": "inspect", "mode": "after_jobs",
                                   "reason": f"score below {cfg.suspect_below:g} for {n.below_s:.0f}s while suspect",
                                   "evidence": {"score": score, "penalties": _penalties(row)}}, cfg, out)
    return out


def _log_low(log: list[list[float]], start: float, end: float, window_s: float) -> list[list[float]]:
    """The node's time below suspect_below within the window: [start, end] added (joined to the last episode when it
    continues it), episodes that ended before the window dropped."""
    kept = [e for e in log if e[1] > end - window_s]
    if kept and kept[-1][1] >= start:
        return [*kept[:-1], [kept[-1][0], max(kept[-1][1], end)]]
    return [*kept, [start, end]]


def _low_s(log: list[list[float]], now: float, window_s: float) -> float:
    """Seconds below suspect_below within the window that ends now."""
    return sum(max(0.0, min(e, now) - max(s, now - window_s)) for s, e in log)


def _penalties(row: Mapping) -> str:
    return "; ".join(f"{p['name']} -{p['points']:g}" for p in row.get("penalties") or [])


def on_fault(n: Node, host: str, f: Mapping, cfg: LifecycleConfig) -> Out:
    """A binned fault: reset/reboot/inspect/replace drain at once (no dwell); retry/ignore never drain."""
    out, ts = Out(), float(f["last_ts"])
    if f["fault_id"] in n.faults:
        return out  # a replay, or the storm summary of a fault already acted on
    n.faults = [*n.faults, f["fault_id"]][-cfg.faults_kept:]
    if n.job is None and (f.get("evidence") or {}).get("job"):  # a fault read before the node's first health row:
        n.job = f["evidence"]["job"]  # the job its samples named (the fleet step hears it before the proposal)
    _tick(n, host, ts, cfg, out)
    if f["bin"] not in cfg.drain_bins or ts <= n.returned_at:
        return out
    mode = (f.get("evidence") or {}).get("mode", "immediate")  # a suspect's: after_jobs (drained once idle)
    cause = {"repair": f["bin"], "mode": mode, "reason": f"fault {f['code']} -> {f['bin']} ({f['rule']})",
             "evidence": {"fault_id": f["fault_id"], "code": f["code"], "bin": f["bin"], "rule": f["rule"],
                          "gpu_index": f.get("gpu_index"), "count": f.get("count", 1),
                          **{f"fault.{k}": v for k, v in (f.get("evidence") or {}).items()}}}
    if n.state in SCHEDULABLE:
        _propose(n, host, ts, cause, cfg, out)
    elif n.state == DRAIN_REQUESTED and (n.cause or {}).get("mode") == "after_jobs" and mode == "immediate":
        # The drain asked for after the job (a suspect) while the GPU now fails hard: the bot is asked again, now
        # (Slurm requeues the job, Kubernetes evicts): the job would only crash on it
        n.cause = _worse(n.cause, cause)
        _request(n, host, "drain", ts, f"now, not after the job: {cause['reason']}", cfg, out,
                 resend_of=(n.request or {}).get("event_id", ""))
    elif n.state in (DRAIN_REQUESTED, DRAINED):
        n.cause = _worse(n.cause, cause)
    elif n.state == REPAIRING and f["bin"] == "replace":
        _to_replace(n, host, ts, cause["reason"], cause["evidence"], cfg, out)
    elif n.state == VALIDATING and n.request is not None and ts > n.request["ts"]:
        _failed_validation(n, host, ts, f"fault during validation: {cause['reason']}", cfg, out)
    return out


def on_decision(n: Node, host: str, d: Mapping, cfg: LifecycleConfig) -> Out:
    """The breaker's answer to this node's pending proposal: drain_requested, or suspect with 'breaker open'."""
    out, ts = Out(), float(d["ts"])
    if n.proposal is None or d["proposal_id"] != n.proposal["id"] or n.state not in SCHEDULABLE:
        return out
    if d.get("busbw_n"):
        n.busbw = [float(d["busbw_median_gbs"]), int(d["busbw_n"])]
    cause, n.proposal = n.proposal["cause"], None
    cost = {f"cost.{k}": v for k, v in (d.get("cost") or {}).items()}  # the fleet step's estimate (cost.py)
    incident = {k: d[k] for k in ("incident", "incident_since", "incident_hosts") if d.get(k)}  # domains.py
    if d["admitted"]:
        cause = _recurring(n, cause, ts, cfg)
        if incident:  # every request of the episode names it: the bots repair the domain's shared part once
            cause = {**cause, "evidence": {**cause["evidence"], **incident}}
        n.episode, n.cause, n.denied_at = n.episode + 1, cause, None
        n.request = {"action": "drain", "event_id": d["event_id"], "ts": ts, "attempt": 1, "requirements": {},
                     "due": ts + cfg.request_timeout_s["drain"]}
        evidence = {**cause["evidence"], "repair": cause["repair"], "mode": cause["mode"], "breaker": d["reason"],
                    **cost}
        reason = cause["reason"] + (f"; {d['cost']['summary']}" if cost else "")
        _go(n, host, DRAIN_REQUESTED, ts, reason, {**evidence, "event_id": d["event_id"]}, out)
        out.requests.append(DrainEvent(event_id=d["event_id"], host=host, action="drain", ts=ts,
                                       reason=reason, evidence=_evidence(evidence)))
        return out
    first, n.denied_at = n.denied_at is None, ts
    evidence = {**cause["evidence"], "breaker": "open", "denied": d.get("reason", ""), **cost}
    reason = f"drain denied, breaker open: {cause['reason']}"
    if n.state == HEALTHY:
        _go(n, host, SUSPECT, ts, reason, evidence, out)
    elif first:  # recorded once per denial streak; the suspect dwell keeps running
        out.states.append(NodeState(host=host, state=n.state, prev_state=n.state, since=n.since, ts=ts,
                                    schedulable=True, reason=reason, evidence=_evidence(evidence)))
    return out


def _recurring(n: Node, cause: dict, ts: float, cfg: LifecycleConfig) -> dict:
    """A node drained again for the repair it was returned from, the K-th time within the window, goes to replace:
    one more reset or reboot would only start the same cycle again (docs/remediation.md)."""
    if cause["repair"] == "replace":
        return cause
    before = [t for t, repair in n.returns if repair == cause["repair"] and ts - t <= cfg.cycles_window_s]
    if len(before) + 1 < cfg.max_cycles:
        return cause
    why = (f"repeat offender: drain {len(before) + 1} for {cause['repair']} within {cfg.cycles_window_s / 3600:g} h "
           f"(returned at {', '.join(f'{t:.0f}' for t in before)})")
    return {"repair": "replace", "mode": cause["mode"], "reason": f"{why}; {cause['reason']}",
            "evidence": {**cause["evidence"], "recurrence": len(before) + 1, "recurring_repair": cause["repair"],
                         "returned_at": ",".join(f"{t:.0f}" for t in before)}}


def _to_replace(n: Node, host: str, ts: float, why: str, evidence: Mapping, cfg: LifecycleConfig, out: Out) -> None:
    n.cause = _worse(n.cause, {"repair": "replace", "mode": "immediate", "reason": why, "evidence": dict(evidence)})
    _go(n, host, REPLACE, ts, why, evidence, out)
    _request(n, host, "replace", ts, why, cfg, out)


def _failed_validation(n: Node, host: str, ts: float, why: str, cfg: LifecycleConfig, out: Out) -> None:
    n.validation_failures += 1
    evidence = {"validation_failures": n.validation_failures, "why": why}
    if n.validation_failures >= cfg.max_validation_failures:
        _to_replace(n, host, ts, f"{why}; {n.validation_failures} failed validations", evidence, cfg, out)
    else:
        _go(n, host, REPAIRING, ts, why, evidence, out)
        _request(n, host, "repair", ts, why, cfg, out, attempt=n.validation_failures + 1)


def on_result(n: Node, host: str, r: Mapping, cfg: LifecycleConfig) -> Out:
    """A remediation bot's answer to the request this node is waiting on (others are stale and ignored). A validation
    passes when it meets every requirement and the node's latest health row carries no gate that fired after the
    repair: a diag that passes on a GPU still reporting a recovery action or a pending remap does not return it."""
    out, ts, ok = Out(), float(r["ts"]), bool(r["ok"])
    req = n.request
    if (req is None or n.state not in EXPECTS or r["action"] != req["action"]
            or not str(r["event_id"]).startswith(f"{host}:{n.episode}:")):
        return out
    detail = {"event_id": r["event_id"], "detail": r.get("detail", ""),
              **{f"measured.{k}": v for k, v in (r.get("measurements") or {}).items()}}
    if n.state == VALIDATING:
        why = check(req["requirements"], r)
        still = _since_repair(n)
        if why is None and still:
            why = (f"validation passed but the node's health still gates it: {', '.join(sorted(still))} (since "
                   f"{min(still.values()):.0f}, after the {n.repaired_at:.0f} repair)")
        if why is not None:
            _failed_validation(n, host, ts, why, cfg, out)
            return out
        gbs = (r.get("measurements") or {}).get("nccl_busbw_gbs")
        if gbs is not None:
            out.reports.append({"kind": "busbw", "host": host, "ts": ts, "gbs": float(gbs)})
        out.reports.append({"kind": "back", "host": host, "ts": ts})  # an incident of its domain may end
        _go(n, host, HEALTHY, ts, "validation passed", {**detail, **{f"required.{k}": v for k, v in
                                                                     req["requirements"].items()}}, out)
        _request(n, host, "undrain", ts, "validation passed", cfg, out)
        n.returns = [*n.returns, [ts, (n.cause or {}).get("repair", "inspect")]][-4 * cfg.max_cycles:]
        n.request, n.cause, n.returned_at = None, None, ts
        n.repair_failures = n.validation_failures = 0
        return out
    if not ok:
        if n.state == REPAIRING:
            n.repair_failures += 1
            if n.repair_failures >= cfg.max_repair_failures:
                _to_replace(n, host, ts, f"{n.repair_failures} failed repairs", detail, cfg, out)
                return out
        req["due"] = ts + cfg.retry_s  # _tick re-sends it
        return out
    if n.state == DRAIN_REQUESTED:
        _go(n, host, DRAINED, ts, "drain completed", detail, out)
        repair = (n.cause or {}).get("repair", "inspect")
        if repair == "replace":
            _to_replace(n, host, ts, (n.cause or {}).get("reason", "replace"), detail, cfg, out)
        else:
            _go(n, host, REPAIRING, ts, f"repair requested: {repair}", detail, out)
            _request(n, host, "repair", ts, f"{repair}: {(n.cause or {}).get('reason', '')}", cfg, out)
    else:  # repair or replacement done
        n.repaired_at = ts
        if r["action"] == "replace":
            n.returns = []  # new parts: their own history starts
        _go(n, host, VALIDATING, ts, f"{r['action']} completed", detail, out)
        _request(n, host, "validate", ts, f"validate after {r['action']}", cfg, out, requirements=requirements(n, cfg))
    return out
