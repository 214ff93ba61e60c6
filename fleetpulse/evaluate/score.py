"""Scoring a run against its ground truth: pure functions over the rows the pipeline wrote (no Kafka, no store).

Each injected fault (a `sim_truth` row) names the signals a detector should raise in `expected`. A signal matches
a truth when it is on the same host (and GPU, or job and rank, where the truth names one) and starts within the
truth's window: from its injection (less `early_s`) to its end (or the run's end) plus `grace_s`. A rack's alerts
(power, RackSilent) match by rack, a job's stall (JobStalled) by job, a fleet-wide silence (FleetSilent) any truth.
From the matches:

- recall per fault kind: injected faults with at least one detection token (`fault:*`, `alert:*`, `straggler`)
  that got a matching signal, over those that have such a token (the rest are reported as not observable);
- precision per fault kind: signals of the kind's tokens that match some truth expecting them, over all such
  signals in the run (an unmatched signal is a false positive);
- detection latency from injection to the first matching signal, in simulated seconds (event time) and in wall
  seconds (Kafka timestamps: publish of the injection -> publish of the signal);
- drains: expected (`drain` token) vs drain requests on the host within the window; a drain request no fault
  expecting it explains is a false drain, and a fault expecting none whose host got one (a whole rack's silence, an
  announced maintenance, a broken monitor) is counted as drained without cause.

Rows are dicts with the table's columns; times are epoch seconds (floats), `kafka_ts` included.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.simulator.truth import EXPECTED, RAMP_MARGIN_S

THERMAL_ALERTS = frozenset({"GpuTempHigh", "GpuTempSlowdown", "GpuTempNearShutdown", "GpuHwThermalSlowdown",
                            "GpuSwThermalSlowdown", "GpuHwSlowdown"})
RACK_ALERTS = frozenset({"RackPowerOverBudget"})
# Tokens of signals about a rack, a job or the whole fleet rather than a host (streams/silence: host "" on each).
RACK_TOKENS = frozenset({"alert:rack_power", "alert:RackSilent"})
JOB_TOKENS = frozenset({"alert:JobStalled"})
FLEET_TOKENS = frozenset({"alert:FleetSilent"})
# The silence stage's outputs (streams/silence/) date what they saw from the last sign of life (first_ts, starts_at:
# the host's last record, the job's last collective), up to an interval before the fault began; they are matched and
# timed by when the stage decided (the record's ts), so a silence is found within its truth's window and its latency
# is the time it took to be called one.
SILENCE_FAULTS = frozenset({"host_silent"})
SILENCE_ALERTS = frozenset({"RackSilent", "FleetSilent", "MonitorBroken", "JobStalled"})
BREAKER_ALERT = "FleetDrainBreakerOpen"
# One per GPU, and one per rack, over its conditions (streams/power_thermal/rules.py), and one per NVLink domain over
# its trays' faults (streams/lifecycle/domains.py): the pages.
INCIDENT_ALERTS = frozenset({"GpuIncident", "RackIncident", "NvlinkDomainDown"})
DETECTION_PREFIXES = ("fault:", "alert:", "straggler")
OUT_OF_SERVICE = frozenset({"drain_requested", "drained", "repairing", "validating", "replace"})


@dataclass(frozen=True)
class Windows:
    """How far around a truth's [start, end] a signal still counts as its detection (simulated seconds)."""

    early_s: float = 1.0
    grace_s: float = 300.0


@dataclass
class Signal:
    """One detection the pipeline published, reduced to what matching needs."""

    token: str
    host: str
    ts: float
    kafka_ts: float
    gpu_index: int | None = None
    job: str | None = None
    rank: int | None = None
    rack: str = ""
    ident: str = ""
    matched: bool = False


@dataclass
class Run:
    """What scoring needs besides the rows: the simulated span and the fleet's size."""

    start_ts: float
    end_ts: float
    hosts: int
    gpus: int
    dwell_s: float = 600.0
    breaker_cap: int | None = None
    breaker_window_s: float = 900.0
    # Per repair bin, how long the run's remediation bot keeps a drained node out (drain, repair, validation, undrain):
    # the truth of usable compute keeps a host out that long after its fault, however soon the fault itself ends.
    out_s: Mapping[str, float] = field(default_factory=dict)
    drain_s: float = 60.0  # the bot's drain itself
    # The simulator's jobs by name (agents/simulator/fleet.Job: world_size, checkpoint_before/after in seconds of the
    # run): a drain after the job waits for its next checkpoint; a job stopped loses the work since its last.
    jobs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """Per-truth result of matching."""

    truth: Mapping
    detected: dict[str, Signal] = field(default_factory=dict)  # token -> first matching signal
    drain: Signal | None = None


def quantiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), "p50": round(float(np.percentile(a, 50)), 3),
            "p95": round(float(np.percentile(a, 95)), 3), "max": round(float(a.max()), 3)}


def signals(faults: Iterable[Mapping], alerts: Iterable[Mapping], stragglers: Iterable[Mapping],
            drains: Iterable[Mapping]) -> list[Signal]:
    """Every detection as a Signal: fault events by code, firing alerts by class, flagged ranks, drain requests.
    An alert's job is its `job` column or labels["job"] (a job's alert: JobStalled). A fault or alert is dated when
    it began (first_ts, starts_at), the silence stage's when it was decided (ts: SILENCE_FAULTS, SILENCE_ALERTS)."""
    out: list[Signal] = []
    for f in faults:
        ts = f["ts"] if f["code"] in SILENCE_FAULTS else f["first_ts"]
        out.append(Signal(f"fault:{f['code']}", f["host"], float(ts), float(f["kafka_ts"]),
                          f.get("gpu_index"), ident=f"{f['fault_id']} bin={f['bin']}"))
    for a in alerts:
        if a["status"] != "firing" or a["alertname"] in INCIDENT_ALERTS:  # an incident pages its conditions' signals
            continue
        token = "alert:thermal" if a["alertname"] in THERMAL_ALERTS else \
            "alert:rack_power" if a["alertname"] in RACK_ALERTS else f"alert:{a['alertname']}"
        job = a.get("job") or (a.get("labels") or {}).get("job") or None
        ts = a["ts"] if a["alertname"] in SILENCE_ALERTS else a["starts_at"]
        out.append(Signal(token, a.get("host") or "", float(ts), float(a["kafka_ts"]), a.get("gpu_index"),
                          job=job, rack=a.get("rack") or "", ident=f"{a['alertname']}/{a['fingerprint']}"))
    seen: set[tuple] = set()
    for s in sorted(stragglers, key=lambda r: r["ts"]):
        if s["flagged"] and (s["job"], s["rank"]) not in seen:  # the first flag of each rank is the detection
            seen.add((s["job"], s["rank"]))
            out.append(Signal("straggler", s["host"], float(s["ts"]), float(s["kafka_ts"]), s.get("gpu_index"),
                              job=s["job"], rank=int(s["rank"]), ident=f"{s['job']}#{s['rank']}"))
    for d in drains:
        if d["action"] == "drain":
            out.append(Signal("drain", d["host"], float(d["ts"]), float(d["kafka_ts"]), ident=d["event_id"]))
    return out


def _window(t: Mapping, run: Run, w: Windows) -> tuple[float, float]:
    end = t.get("end_ts")
    return float(t["ts"]) - w.early_s, (float(end) if end else run.end_ts) + w.grace_s


def _fits(sig: Signal, t: Mapping) -> bool:
    """Same place: the rack for rack alerts, the job for a job's stall, the job and rank for stragglers, anywhere for a
    fleet's alert, else the host (and GPU if named)."""
    if sig.token in RACK_TOKENS:
        return bool(sig.rack) and sig.rack == t.get("rack")
    if sig.token in JOB_TOKENS:
        return sig.job is not None and sig.job == t.get("job")
    if sig.token in FLEET_TOKENS:
        return True
    if sig.token == "straggler" and t.get("job") is not None and t.get("rank") is not None:
        return sig.job == t["job"] and sig.rank == t["rank"]
    if sig.host != t["host"]:
        return False
    g = t.get("gpu_index")
    return g is None or sig.gpu_index is None or sig.gpu_index == g


def match(truth: Sequence[Mapping], sigs: Sequence[Signal], run: Run, w: Windows = Windows()) -> list[Outcome]:
    """Pair each truth with the first signal of each expected token; mark every signal that explains a truth."""
    by_token: dict[str, list[Signal]] = defaultdict(list)
    for s in sorted(sigs, key=lambda s: s.ts):
        by_token[s.token].append(s)
    outcomes = []
    for t in sorted(truth, key=lambda t: t["ts"]):
        o = Outcome(t)
        lo, hi = _window(t, run, w)
        for token in {*t.get("allowed", ())} - {*t["expected"]}:  # a band where timing decides: explained, not found
            for s in by_token.get(token, ()):
                if lo <= s.ts <= hi and _fits(s, t):
                    s.matched = True
        for token in {*t["expected"]}:
            hits = [s for s in by_token.get(token, ()) if lo <= s.ts <= hi and _fits(s, t)]
            for s in hits:
                s.matched = True
            if hits:
                if token == "drain":
                    o.drain = hits[0]
                else:
                    o.detected[token] = hits[0]
        outcomes.append(o)
    return outcomes


def _detection_tokens(t: Mapping) -> list[str]:
    return [e for e in t["expected"] if e.startswith(DETECTION_PREFIXES)]


def per_kind(outcomes: Sequence[Outcome], sigs: Sequence[Signal], injected_at: Mapping[str, float]) -> dict:
    """Recall, precision, latencies and drains for each fault kind."""
    kinds: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        kinds[o.truth["kind"]].append(o)
    out = {}
    for kind, group in sorted(kinds.items()):
        tokens = {tok for o in group for tok in _detection_tokens(o.truth)}
        observable = [o for o in group if _detection_tokens(o.truth)]
        detected = [o for o in observable if o.detected]
        sim, wall = [], []
        for o in detected:
            first = min(o.detected.values(), key=lambda s: s.ts)
            sim.append(first.ts - float(o.truth["ts"]))
            wall.append(first.kafka_ts - injected_at[o.truth["fault_id"]])
        mine = [s for s in sigs if s.token in tokens]
        true_pos = sum(s.matched for s in mine)
        expect_drain = [o for o in group if "drain" in o.truth["expected"]]
        drained = [o for o in expect_drain if o.drain is not None]
        row = {
            "injected": len(group), "hardware": sum(bool(o.truth["hardware"]) for o in group),
            "observable": len(observable), "detected": len(detected),
            "recall": round(len(detected) / len(observable), 4) if observable else None,
            "precision": round(true_pos / len(mine), 4) if mine else None,
            "false_positives": len(mine) - true_pos,
            "tokens": sorted(tokens),
            "missed": [o.truth["fault_id"] for o in observable if not o.detected][:20],
            "latency_sim_s": quantiles(sim), "latency_wall_s": quantiles(wall),
            "drain": {
                "expected": len(expect_drain), "requested": len(drained),
                "recall": round(len(drained) / len(expect_drain), 4) if expect_drain else None,
                "latency_sim_s": quantiles([o.drain.ts - float(o.truth["ts"]) for o in drained]),
                "latency_wall_s": quantiles([o.drain.kafka_ts - injected_at[o.truth["fault_id"]] for o in drained]),
            },
        }
        causes = sorted({o.truth.get("cause") or "" for o in group} - {""})
        if causes:
            row["causes"] = causes
        out[kind] = row
    return out


def drains(outcomes: Sequence[Outcome], sigs: Sequence[Signal], truth: Sequence[Mapping], run: Run,
           w: Windows = Windows()) -> dict:
    """Every drain request judged: explained by a fault expecting a drain, or false (and whose). Faults that expect
    no drain (software ones, and any other: a whole rack's silence, an announced maintenance, a broken monitor) and
    whose host got a false drain within their window are counted, per kind."""
    requests = [s for s in sigs if s.token == "drain"]
    false = [s for s in requests if not s.matched]
    software = [t for t in truth if not t["hardware"]]
    sw_drained = set()
    for t in software:  # a drain on the host of a software fault, while no hardware fault explains it
        lo, hi = _window(t, run, w)
        if any(s.host == t["host"] and lo <= s.ts <= hi for s in false):
            sw_drained.add(t["fault_id"])
    no_drain = [t for t in truth if "drain" not in t["expected"]]
    drained_anyway: dict[str, int] = defaultdict(int)
    for t in no_drain:  # a drain on the host of a fault that expects none, while no other fault explains it
        lo, hi = _window(t, run, w)
        if any(s.host == t["host"] and lo <= s.ts <= hi for s in false):
            drained_anyway[t["kind"]] += 1
    hw = [o for o in outcomes if o.truth["hardware"] and "drain" in o.truth["expected"]]
    return {
        "requested": len(requests), "hosts": len({s.host for s in requests}),
        "true": len(requests) - len(false), "false": len(false),
        "false_hosts": sorted({s.host for s in false})[:50],
        "hardware_expected": len(hw), "hardware_drained": sum(o.drain is not None for o in hw),
        "software_faults": len(software), "software_drained": len(sw_drained),
        "software_false_drain_rate": round(len(sw_drained) / len(software), 4) if software else None,
        "no_drain_faults": len(no_drain), "no_drain_drained": sum(drained_anyway.values()),
        "no_drain_drained_by_kind": dict(sorted(drained_anyway.items())),
    }


def hardware_recall(outcomes: Sequence[Outcome]) -> dict:
    """Hardware-attributable faults (hardware and a signal on the host a detector can see) detected."""
    hw = [o for o in outcomes if o.truth["hardware"]]
    visible = [o for o in hw if _detection_tokens(o.truth)]
    found = [o for o in visible if o.detected]
    hidden = defaultdict(int)
    for o in hw:
        if not _detection_tokens(o.truth):
            hidden[o.truth.get("cause") or o.truth["kind"]] += 1
    return {"hardware_faults": len(hw), "attributable": len(visible), "detected": len(found),
            "recall": round(len(found) / len(visible), 4) if visible else None,
            "not_visible_to_gpu_telemetry": dict(sorted(hidden.items()))}


def suspect_policies(truth: Sequence[Mapping], sigs: Sequence[Signal], states: Sequence[Mapping], run: Run,
                     restart_s: float, w: Windows = Windows()) -> dict:
    """What the run's policy for a suspect GPU (drained once its job reaches a checkpoint) cost the jobs, against
    draining it at once, both from this run: each memory ramp on a job's host, by when it was first suspect (its
    `fault:ecc_trend`), when its node was drained (node_states) and when it was to fail (its lead). A job stopped loses
    `restart_s` and the work since its last checkpoint; one that leaves the node at a checkpoint, its restart alone;
    one the failure crashes, both. The node's repair takes as long under either policy (only when it begins
    differs): not counted. A ramp whose failure and drain both lie past the run's end is left out (undecided)."""
    drained: dict[str, list[float]] = defaultdict(list)
    for r in states:
        if r["state"] == "drained":
            drained[r["host"]].append(float(r["ts"]))
    ramps = [t for t in truth if t["kind"] == "ecc_ramp"]
    lost = {"drain_when_idle": 0.0, "drain_at_once": 0.0}
    leads, counts = [], defaultdict(int)
    for t in ramps:
        ts, lo_hi = float(t["ts"]), _window(t, run, w)
        fails = ts + (t.get("params") or {}).get("lead_s", math.inf)
        suspect = min((s.ts for s in sigs if s.token == "fault:ecc_trend" and lo_hi[0] <= s.ts <= lo_hi[1]
                       and _fits(s, t)), default=None)
        if suspect is not None and suspect < fails:
            counts["suspect_before_failure"] += 1
            leads.append((fails - suspect) / 60.0)
        job = run.jobs.get(t.get("job") or "")
        out = min((d for d in drained[t["host"]] if d >= (suspect if suspect is not None else ts)), default=None)
        if job is None:
            counts["idle_hosts"] += 1
            continue
        if fails > run.end_ts and (out is None or out > run.end_ts):
            counts["undecided_at_end"] += 1
            continue
        gpus, restart_h = job.world_size, restart_s / 3600.0
        crash = gpus * (restart_h + (fails - _ckpt(run, job, fails, after=False)) / 3600.0)
        if out is not None and out <= fails:
            counts["drained_before_failure"] += 1
            lost["drain_when_idle"] += gpus * restart_h
        else:
            counts["failed_before_drain"] += 1
            lost["drain_when_idle"] += crash
        lost["drain_at_once"] += (gpus * (restart_h + (suspect - _ckpt(run, job, suspect, after=False)) / 3600.0)
                                  if suspect is not None and suspect < fails else crash)
    return {"ramps": len(ramps), **{k: counts[k] for k in ("suspect_before_failure", "idle_hosts",
                                                             "drained_before_failure", "failed_before_drain",
                                                             "undecided_at_end")},
            "lead_min": quantiles(leads), "gpu_hours_lost": {k: round(v, 1) for k, v in lost.items()},
            "basis": f"a stopped job loses {restart_s:g} s of restart and the work since its last checkpoint; the "
                     f"repairs take as long either way"}


SOFT = frozenset({"healthy", "suspect"})


def _most_within(ts: np.ndarray, span: float) -> int:
    """The most timestamps (sorted) inside any window of `span` seconds that starts at one of them."""
    return int(max((np.searchsorted(ts, t + span, side="left") - i for i, t in enumerate(ts)), default=0))


def transitions(states: Sequence[Mapping], run: Run) -> dict:
    """State changes per node; the most within any dwell window, all of them and the health-driven ones alone
    (healthy <-> suspect: the ones hysteresis and dwell must hold down; the repair loop moves on the bots' answers);
    and breaks in each node's chain of states (a transition whose prev_state is not the state last published, as a
    restarted worker that forgot its nodes would publish)."""
    by_host: dict[str, list[Mapping]] = defaultdict(list)
    for s in sorted(states, key=lambda s: (s["kafka_partition"], s["kafka_offset"])):
        by_host[s["host"]].append(s)
    per_node, most, most_soft, breaks = {}, 0, 0, []
    for host, rows in by_host.items():
        per_node[host] = len(rows)
        most = max(most, _most_within(np.array([float(r["ts"]) for r in rows]), run.dwell_s))
        soft = [float(r["ts"]) for r in rows if r["state"] in SOFT and (r.get("prev_state") or "healthy") in SOFT]
        most_soft = max(most_soft, _most_within(np.array(soft), run.dwell_s))
        prev = "healthy"
        for r in rows:
            if (r.get("prev_state") or "healthy") != prev:
                breaks.append(f"{host}: {r.get('prev_state')} after {prev}")
            prev = r["state"]
    counts = sorted(per_node.values())
    by_state: dict[str, int] = defaultdict(int)
    for s in states:
        by_state[s["state"]] += 1
    return {"total": len(states), "nodes": len(per_node), "per_node_max": counts[-1] if counts else 0,
            "per_node_median": float(np.median(counts)) if counts else 0.0, "dwell_s": run.dwell_s,
            "max_changes_per_dwell": most, "max_health_changes_per_dwell": most_soft,
            "into": dict(sorted(by_state.items())), "chain_breaks": len(breaks), "chain_break_examples": breaks[:10]}


def breaker(alerts: Sequence[Mapping], sigs: Sequence[Signal], run: Run) -> dict:
    """Trips (breaker alerts firing) and the most drains requested within any breaker window, against the cap."""
    trips = [a for a in alerts if a["alertname"] == BREAKER_ALERT and a["status"] == "firing"]
    most = _most_within(np.sort(np.array([s.ts for s in sigs if s.token == "drain"], dtype=float)),
                        run.breaker_window_s)
    return {"trips": len(trips), "first_trip_ts": min((float(a["starts_at"]) for a in trips), default=None),
            "max_drains_in_window": most, "window_s": run.breaker_window_s, "cap": run.breaker_cap,
            "within_cap": run.breaker_cap is None or most <= run.breaker_cap}


def alert_counts(alerts: Iterable[Mapping], run: Run) -> dict:
    """Alerts by name and status, and the pages: how noisy the run was for whoever is paged. A page is a firing
    notification of an alert that is nobody's condition: a GPU or rack incident opening or escalating, the breaker;
    the per-rule conditions inside an incident are its evidence, not pages of their own."""
    out: dict[str, dict[str, int]] = {"firing": defaultdict(int), "resolved": defaultdict(int)}
    pages: dict[str, int] = defaultdict(int)
    for a in alerts:
        out[a["status"]][a["alertname"]] += 1
        if a["status"] == "firing" and not int(a.get("condition") or 0):
            pages[a["alertname"]] += 1
    hours = max(run.end_ts - run.start_ts, 1.0) / 3600
    return {**{status: dict(sorted(by_name.items())) for status, by_name in out.items()},
            "pages": sum(pages.values()), "pages_by_name": dict(sorted(pages.items())),
            "pages_per_hour": round(sum(pages.values()) / hours, 2)}


def stragglers(outcomes: Sequence[Outcome], sigs: Sequence[Signal]) -> dict:
    """Which ranks were flagged: the injected ones (and how soon after onset) and any other."""
    flagged = [s for s in sigs if s.token == "straggler"]
    others = sorted({s.ident for s in flagged if not s.matched})
    onset = [s.ts - float(o.truth["ts"]) for o in outcomes for tok, s in o.detected.items() if tok == "straggler"]
    expected = sum("straggler" in o.truth["expected"] for o in outcomes)
    return {"expected": expected, "flagged_expected": len(onset), "flag_after_onset_s": quantiles(onset),
            "other_ranks_flagged": len(others), "other_ranks": others[:20]}


def seen_by_end(truth: Sequence[Mapping], run: Run) -> list[Mapping]:
    """The truth as the run could show it: a memory ramp the trend rule can only call a climb after the run's end
    (its `suspect_after_s`, agents/simulator/truth.py, and the simulator's margin) expects no suspect of this run; its
    suspect's tokens become allowed (a run cut short, as a test's is)."""
    out = []
    for t in truth:
        after = (t.get("params") or {}).get("suspect_after_s")
        if t["kind"] == "ecc_ramp" and after is not None and float(t["ts"]) + after + RAMP_MARGIN_S > run.end_ts:
            moved = [tok for tok in t["expected"] if tok in EXPECTED["ecc_ramp"]]
            t = {**t, "expected": [tok for tok in t["expected"] if tok not in moved],
                 "allowed": [*t.get("allowed", ()), *moved]}
        out.append(t)
    return out


def _ckpt(run: Run, job: Any, ts: float, after: bool) -> float:
    """The job's checkpoint after (or before) epoch `ts`, in epoch seconds."""
    rel = ts - run.start_ts
    return run.start_ts + (job.checkpoint_after(rel) if after else job.checkpoint_before(rel))


def _drain_begins(t: Mapping, run: Run) -> tuple[float, bool]:
    """When the truth's drain of a fault's host begins, and whether it waited for the host's job (a drain after the
    job: its GPUs count as in use until the bot drains it): at once, but a memory ramp's once it is suspect and its
    job reaches a checkpoint, or at its failure if that comes first."""
    ts, params = float(t["ts"]), t.get("params") or {}
    if t["kind"] != "ecc_ramp" or "suspect_after_s" not in params:
        return ts, False
    suspect, fails = ts + params["suspect_after_s"], ts + params.get("lead_s", math.inf)
    job = run.jobs.get(t.get("job") or "")
    waits = _ckpt(run, job, suspect, after=True) if job is not None else suspect
    return (waits, True) if waits < fails else (fails, False)


def _out_at(t: Mapping, run: Run) -> float:
    """When a host a fault takes out leaves service in the truth."""
    begins, waited = _drain_begins(t, run)
    return begins + (run.drain_s if waited else 0.0)


def _back_at(t: Mapping, run: Run) -> float:
    """When a host a fault took out is back in the truth: the fault's end or its repair cycle's, whichever is later
    (no end and no cycle: never)."""
    repair = next((tok.split(":", 1)[1] for tok in t["expected"] if tok.startswith("bin:")), "inspect")
    if (t.get("params") or {}).get("domain_trays", 0) > 1 and "domain" in run.out_s:
        repair = "domain"  # a whole NVLink domain's fault: its trays wait for the shared part's one repair
    ends = [float(t["end_ts"])] if t.get("end_ts") else []
    if repair in run.out_s:
        ends.append(_drain_begins(t, run)[0] + run.out_s[repair])
    return max(ends) if ends else math.inf


def usable_compute(minutes: Sequence[Mapping], truth: Sequence[Mapping], run: Run) -> dict:
    """Measured usable compute per minute against truth: the share of GPUs not on a host that a hardware fault
    should take out (a `drain` token), from the fault until the later of its end and its repair cycle (Run.out_s of
    its bin: a drained node stays out while it is repaired and validated), per minute of the run in which every node
    had reported (earlier minutes cover part of the fleet and are only counted); a minute counts when it overlaps the
    run (fleetpulse/outcomes.py's rule). Both as at the minute's end in event time: the lifecycle reports a minute minute_lateness_s after it, with every node's state at its end."""
    if not minutes:
        return {"minutes": 0}
    measured, expected, partial = [], [], 0
    for m in sorted(minutes, key=lambda m: m["minute_ts"]):
        t0 = float(m["minute_ts"])
        if not run.start_ts - 60 < t0 < run.end_ts:  # every minute that overlaps the run, as the report counts them
            continue
        if m.get("nodes", run.hosts) < run.hosts:
            partial += 1  # the lifecycle has not heard from every node yet: not the fleet's figure
            continue
        out_hosts = {t["host"] for t in truth if "drain" in t["expected"] and t["hardware"]
                     and _out_at(t, run) <= t0 + 60 < _back_at(t, run)}
        measured.append(float(m["usable_compute"]))
        expected.append(1.0 - len(out_hosts) / max(run.hosts, 1))
    if not measured:
        return {"minutes": 0, "minutes_partial": partial}
    a, b = np.array(measured), np.array(expected)
    last = max(minutes, key=lambda m: m["minute_ts"])
    return {"minutes": len(measured), "minutes_partial": partial, "measured_mean": round(float(a.mean()), 4),
            "truth_mean": round(float(b.mean()), 4), "mean_abs_error": round(float(np.abs(a - b).mean()), 4),
            "measured_min": round(float(a.min()), 4), "last_breakdown": last.get("breakdown", {})}
