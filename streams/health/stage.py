"""The health stage: samples, faults, remediation results and straggler flags in; GPU and node 0-100 scores out.

Straggler standings arrive on fleet.stragglers keyed by job; the step forwards the ranks that are or were recently
flagged to the internal topic health-stragglers_by_host, keyed by host, where they meet the host's state. Each host's
records fold into its state and the step publishes the rows `news` picks: at 2,048 hosts one node row per host per
heartbeat (~34/s) plus changes, not one per sample (~400/s). Host state reaches the changelog whenever the host
publishes a row or takes a fault, flag or repair; between those only EWMAs and counter baselines move (kept in
memory), so a crash costs at most one heartbeat of smoothing, never a gate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from core.errors import DecodeError
from schemas.analytics import HealthScore
from schemas.codec import encode
from schemas.limits import MAX_GPUS
from schemas.topics import FAULTS, HEALTH, HEALTH_STRAGGLERS, REMEDIATION, SAMPLES, STRAGGLERS
from streams.health.rules import (HealthConfig, HostHealth, Scores, apply_fault, apply_remediation, apply_samples,
                                  apply_straggler, score_all)
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step

HOSTS = "hosts"
NUMBER = (int, float)
FORWARDED = ("host", "gpu_index", "ts", "flagged", "slowdown_pct", "z", "job", "rank")
_KEYS = [str(i) for i in range(MAX_GPUS)]  # HostHealth.emitted's GPU keys
APPLY = {"fault": apply_fault, "result": lambda st, rec, cfg: apply_remediation(st, rec),
         "straggler": lambda st, rec, cfg: apply_straggler(st, rec)}


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


def news(h: HostHealth, sc: Scores, cfg: HealthConfig) -> list[HealthScore]:
    """The rows worth publishing: a node or GPU whose score moved >= emit_delta or whose gates changed, and every
    node each heartbeat_s (with its GPUs below 100). Rows are built only for these. Updates h.emitted."""
    out: list[HealthScore] = []
    emitted, delta = h.emitted, cfg.emit_delta
    h.sent_cache = None  # rebuilt from `emitted` when next read
    last = emitted.get("node")
    beat = last is None or sc.ts - last[2] >= cfg.heartbeat_s
    for i, score, gates in zip(range(len(sc.gpu_gates)), sc.gpu_score.tolist(), sc.gpu_gates):
        prev = emitted.get(_KEYS[i])
        if prev is None or abs(score - prev[0]) >= delta or gates != prev[1] or (beat and score < 100):
            out.append(sc.gpu(i))
            emitted[_KEYS[i]] = [score, gates]
    node_gates = sorted(sc.gates)
    if beat or abs(sc.node_score - last[0]) >= delta or node_gates != last[1] or sc.job != h.told_job:
        out.append(sc.node())
        emitted["node"] = [sc.node_score, node_gates, sc.ts]
        h.told_job = sc.job  # the lifecycle learns the host's job (a drain's cost) from the node row
    return out


def step(records: Sequence[Record], state: State, cfg: HealthConfig) -> list[Emit]:
    """Every record that changes a host is scored at its own time, whatever the batch: the records fold in rounds (a
    host's k-th record of the batch in round k), each round vectorised over its hosts, so one sample per host per batch
    (the steady state) costs one round, and a backlog scores every reading it holds, as it would have live."""
    out: list[Emit] = []
    hosts: dict[str, HostHealth] = {}
    durable: set[str] = set()
    rounds: list[list[tuple[str, Record]]] = []
    depth: dict[str, int] = {}
    for r in records:
        rec = r.value
        if r.kind == "standing":  # flagged now, or a flag that may just clear: tell the rank's host
            if rec["flagged"] or rec.get("windows_flagged", 0):
                out.append(Emit(HEALTH_STRAGGLERS, rec["host"].encode(), orjson.dumps({k: rec.get(k) for k in FORWARDED})))
            continue
        host = rec["host"]
        if host not in hosts:
            hosts[host] = state.get(HOSTS, host) or HostHealth()
        k = depth.get(host, 0)
        depth[host] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append((host, r))
    rows: list[HealthScore] = []
    for turn in rounds:
        rows += _round(turn, hosts, durable, cfg)
    for host, st in hosts.items():
        state.put(HOSTS, host, st, durable=host in durable)
    return [Emit(HEALTH, row.host.encode(), encode(row)) for row in rows] + out


def _round(turn: list[tuple[str, Record]], hosts: dict[str, HostHealth], durable: set[str],
           cfg: HealthConfig) -> list[HealthScore]:
    """One record per host: apply each, then score the hosts it changed at the record's time; the rows that are news."""
    samples = [(hosts[host], r.value) for host, r in turn if r.kind == "sample"]
    folded = iter(apply_samples(samples, cfg))
    scored: list[tuple[HostHealth, str, float]] = []
    for host, r in turn:
        st, rec = hosts[host], r.value
        if r.kind == "sample":
            changed = next(folded)
        else:
            changed = APPLY[r.kind](st, rec, cfg)
            if changed:
                durable.add(host)
        if changed and st.installed:  # installed 0: no sample yet, nothing to score
            scored.append((st, host, max(st.wm, float(rec["last_ts"] if r.kind == "fault" else rec["ts"]))))
    rows: list[HealthScore] = []
    for (st, host, _), sc in zip(scored, score_all(scored, cfg, skip_quiet=True)):
        if sc is None:  # nothing of this host is news
            continue
        picked = news(st, sc, cfg)
        if picked:
            durable.add(host)
            rows += picked
    return rows


SETTING = Setting("health", HealthConfig, "health score weights and scales")
STAGE = StageSpec(
    name="health",
    description="hard gates and weighted penalties per GPU and node -> 0-100 scores with reasons, on change and "
                "heartbeat",
    steps=(Step("telemetry", (Input(SAMPLES, "sample"), Input(FAULTS, "fault"), Input(REMEDIATION, "result"),
                              Input(STRAGGLERS, "standing"), Input(HEALTH_STRAGGLERS, "straggler", check_straggler)),
                step),),
    outputs=(HEALTH, HEALTH_STRAGGLERS),
    tables=(StateTable(HOSTS, "per-host GPU EWMAs, counter baselines, gates, fault history, straggler flags, last rows",
                  live=HostHealth),),
    config=SETTING.of,
    settings=(SETTING,),
)
