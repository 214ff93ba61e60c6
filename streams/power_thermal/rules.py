"""Per-GPU power/thermal alert rules against each device's own limits and throttle bits, with dwell and hysteresis,
and one incident per GPU over them: the page.

Each rule fires and resolves its own alert (a condition). A GPU with any condition firing has one incident,
`GpuIncident`: it fires with the first condition, fires again (same fingerprint, the higher severity) only when a
more severe condition joins, lists the conditions firing in its summary, and resolves with the last one. A condition
that fires while a more severe one is firing on the same GPU carries `inhibited_by` (Alertmanager's inhibition, done
here): whoever pages routes `GpuIncident` (and `RackIncident`, the same over a rack's budget alerts: racks.py) and
keeps the conditions as their evidence.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from schemas.analytics import Alert, fingerprint
from schemas.limits import MAX_GPUS
from schemas.throttle import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL

# GpuReading fields the rules read, in column order of the batch matrix.
FIELDS = ("gpu_temp_c", "slowdown_temp_c", "shutdown_temp_c", "gpu_max_op_temp_c", "hbm_temp_c",
          "hbm_max_op_temp_c", "power_w", "power_limit_w", "power_default_limit_w")
COL = {name: i for i, name in enumerate(FIELDS)}
_READ = (*FIELDS, "throttle_reasons", "index")  # the matrix columns, then the two read as Python ints
_THR, _IDX = len(FIELDS), len(FIELDS) + 1
_reading = operator.itemgetter(*_READ)
_GPUS = MAX_GPUS  # a row's GPU key: host number * MAX_GPUS + GPU index


@dataclass(frozen=True)
class Rule:
    """One alert: `signal` >= limit * scale + offset (or a throttle bit set) for dwell_s fires it.

    It resolves once the signal stays below threshold - margin (margin x limit when relative) for resolve_s.
    Flap damping: an alert that fires again within flap_window_s of resolving doubles its resolve hold for each such
    return (up to max_hold_factor x resolve_s), so a sensor oscillating around a threshold keeps one alert firing
    instead of paging every cycle (Prometheus' keep_firing_for, made adaptive like BGP route-flap damping) [ours].
    """

    alertname: str
    severity: str
    signal: str
    limit: str | None = None
    scale: float = 1.0
    offset: float = 0.0
    bit: int = 0
    margin: float = 3.0
    relative_margin: bool = False
    dwell_s: float = 30.0
    resolve_s: float = 60.0
    what: str = ""
    shown: str = ""  # the summary's reading, str.format over the GPU's fields; default: signal vs threshold
    flap_window_s: float = 1800.0
    max_hold_factor: int = 16

    def resolve_hold(self, flaps: int) -> float:
        return self.resolve_s * min(2 ** flaps, self.max_hold_factor)


DEFAULT_RULES = (
    Rule("GpuTempHigh", "warning", "gpu_temp_c", "gpu_max_op_temp_c", dwell_s=60,
         what="GPU temperature at max operating"),
    Rule("GpuTempSlowdown", "critical", "gpu_temp_c", "slowdown_temp_c", dwell_s=15,
         what="GPU temperature at slowdown"),
    Rule("GpuTempNearShutdown", "page", "gpu_temp_c", "shutdown_temp_c", offset=-2.0, margin=2.0, dwell_s=0,
         what="GPU temperature within 2 C of shutdown"),
    Rule("HbmTempHigh", "warning", "hbm_temp_c", "hbm_max_op_temp_c", offset=-2.0, dwell_s=60,
         what="HBM temperature near max operating"),
    Rule("GpuPowerOverLimit", "warning", "power_w", "power_limit_w", scale=1.05, margin=0.05, relative_margin=True,
         dwell_s=30, what="power draw over the enforced limit"),
    Rule("GpuHwSlowdown", "critical", "throttle_reasons", bit=HW_SLOWDOWN, dwell_s=10, what="HW slowdown active"),
    Rule("GpuHwThermalSlowdown", "critical", "throttle_reasons", bit=HW_THERMAL, dwell_s=10,
         what="HW thermal slowdown active"),
    Rule("GpuHwPowerBrake", "critical", "throttle_reasons", bit=HW_POWER_BRAKE, dwell_s=10,
         what="HW power brake slowdown active"),
    Rule("GpuSwThermalSlowdown", "warning", "throttle_reasons", bit=SW_THERMAL, dwell_s=60,
         what="SW thermal slowdown active"),
    Rule("GpuSwPowerCap", "info", "throttle_reasons", bit=SW_POWER_CAP, dwell_s=300, resolve_s=120,
         what="SW power cap holding clocks down"),
    # The enforced limit 3 % or more under the board's default: someone or something (nvidia-smi -pl, a BMC or rack
    # power manager, a PSU event) capped the GPU. Load alone never moves the limit, so no dwell: a cap of a minute is
    # seen, where GpuSwPowerCap (the driver holding clocks at whatever limit, which busy GPUs hit all the time) needs
    # 300 s [ours]. Info: a cap may be deliberate; the incident lists it beside any throttling it causes.
    Rule("GpuPowerLimitReduced", "info", "power_default_limit_w", "power_limit_w", scale=1.03, margin=0.02,
         relative_margin=True, dwell_s=0, resolve_s=60, what="enforced power limit below the board's default",
         shown="enforced {power_limit_w:g} W, default {power_default_limit_w:g} W"),
)


INCIDENT = "GpuIncident"
RACK_INCIDENT = "RackIncident"
SEVERITY = {"info": 0, "warning": 1, "critical": 2, "page": 3}


@dataclass(frozen=True)
class GpuRuleConfig:
    rules: tuple[Rule, ...] = DEFAULT_RULES
    max_gap_s: float = 120.0  # a pending or resolving timer restarts after this long without a known reading
    rack_budgets_w: Mapping[str, float] = field(default_factory=dict)  # racks to forward power reports for


@dataclass(frozen=True)
class AlertState:
    """Where one (subject, alertname) stands: pending_since counts toward the opposite status; flaps counts the
    returns within the flap window that lengthen the resolve hold, resolved_at when it last resolved."""

    pending_since: float | None = None
    firing: bool = False
    starts_at: float = 0.0
    last_value: float = math.nan
    last_ts: float = 0.0
    flaps: int = 0
    resolved_at: float = 0.0

    def to_json(self) -> list:
        value = None if math.isnan(self.last_value) else self.last_value
        return [self.pending_since, self.firing, self.starts_at, value, self.last_ts, self.flaps, self.resolved_at]

    @classmethod
    def from_json(cls, raw: list) -> AlertState:
        pending, firing, starts_at, value, last_ts, *damping = raw  # records from before flap damping have 5
        flaps, resolved_at = damping or (0, 0.0)
        return cls(pending, bool(firing), starts_at, math.nan if value is None else value, last_ts, int(flaps),
                   resolved_at)

    def worth_keeping(self, ts: float, rule: Rule) -> bool:
        """Firing, pending, or resolved recently enough that a return would count as a flap."""
        return self.firing or self.pending_since is not None or (
            self.resolved_at > 0 and ts - self.resolved_at <= rule.flap_window_s)


@dataclass(frozen=True)
class SubjectState:
    """State of one host (keys 'gpu/alertname') or one rack; `wm` is the newest sample time applied; `incidents` each
    GPU's incident (key: its index) as incident_step keeps it."""

    wm: float = 0.0
    alerts: dict[str, AlertState] = field(default_factory=dict)
    incidents: dict[str, dict] | None = field(default_factory=dict)  # None: written before incidents were kept

    def to_json(self) -> dict:
        out = {"wm": self.wm, "alerts": {k: v.to_json() for k, v in self.alerts.items()}}
        return {**out, "incidents": self.incidents} if self.incidents is not None else out

    @classmethod
    def from_json(cls, raw: dict | None) -> SubjectState:
        if not raw:
            return cls()
        return cls(raw["wm"], {k: AlertState.from_json(v) for k, v in raw["alerts"].items()}, raw.get("incidents"))


@dataclass(frozen=True)
class RackReport:
    """One host's GPU power at one instant, forwarded to the rack evaluation (keyed by rack)."""

    rack: str
    host: str
    ts: float
    power_w: float  # sum of the GPUs whose power is known
    complete: bool  # every GPU's power was known


@dataclass
class Judged:
    """What evaluate() made of a batch of samples: alerts to send, subjects whose state changed, rack reports."""

    alerts: list[Alert]
    state: dict[str, SubjectState]  # only the subjects that changed
    rack_reports: list[RackReport]


def step(st: AlertState, ts: float, value: float, on: bool, off: bool, rule: Rule, max_gap_s: float):
    """Advance one alert by one known reading; returns (new state, 'firing' | 'resolved' | None)."""
    pending = st.pending_since
    if pending is not None and ts - st.last_ts > max_gap_s:
        pending = None  # an unobserved gap does not count toward a dwell
    event = None
    firing, starts_at, flaps, resolved_at = st.firing, st.starts_at, st.flaps, st.resolved_at
    if not firing:
        pending = (ts if pending is None else pending) if on else None
        if pending is not None and ts - pending >= rule.dwell_s:
            firing, starts_at, pending, event = True, pending, None, "firing"
            returned = resolved_at > 0 and starts_at - resolved_at <= rule.flap_window_s
            flaps = flaps + 1 if returned else 0
    else:
        pending = (ts if pending is None else pending) if off else None
        if pending is not None and ts - pending >= rule.resolve_hold(flaps):
            firing, pending, event, resolved_at = False, None, "resolved", ts
    return AlertState(pending, firing, starts_at, value, ts, flaps, resolved_at), event



def _rule_arrays(rule: Rule, m: np.ndarray, throttle: np.ndarray):
    """Vectorised over all GPU rows: (value, threshold, resolve_below, on, off, known) for one rule."""
    if rule.bit:
        known = throttle >= 0
        value = ((throttle & rule.bit) != 0).astype(float)
        threshold = np.ones_like(value)
        return value, threshold, threshold, known & (value >= 1), known & (value < 1), known
    value, limit = m[:, COL[rule.signal]], m[:, COL[rule.limit]]
    threshold = limit * rule.scale + rule.offset
    below = threshold - (rule.margin * limit if rule.relative_margin else rule.margin)
    known = np.isfinite(value) & np.isfinite(threshold)
    with np.errstate(invalid="ignore"):  # NaN (unknown) compares False both ways
        return value, threshold, below, value >= threshold, value < below, known


def evaluate(samples: Sequence[dict], state: Mapping[str, SubjectState],
             config: GpuRuleConfig = GpuRuleConfig()) -> Judged:
    """Apply a batch of checked host samples to prior per-host state; returns alerts, changed state, rack reports."""
    rows, row_sample, row_gpu, row_host, reports = [], [], [], [], []
    wm = {h: s.wm for h, s in state.items()}
    host_num: dict[str, int] = {}
    for i in sorted(range(len(samples)), key=lambda i: samples[i]["ts"]):
        s = samples[i]
        if s["ts"] <= wm.get(s["host"], 0.0):
            continue  # already applied (a replay after a restart) or out of order
        wm[s["host"]] = s["ts"]
        gpus = s["gpus"]
        try:
            rows += list(map(_reading, gpus))
        except KeyError:  # a reading that leaves optional fields out
            rows += [[g.get(f) for f in _READ] for g in gpus]
        row_sample += [i] * len(gpus)
        row_gpu += gpus
        row_host += [host_num.setdefault(s["host"], len(host_num))] * len(gpus)
        if s.get("rack", "") in config.rack_budgets_w:
            power = [g.get("power_w") for g in gpus]
            known = [p for p in power if p is not None]
            reports.append(RackReport(s["rack"], s["host"], s["ts"], float(sum(known)), len(known) == len(power)))
    throttle = np.array([-1 if r[_THR] is None else r[_THR] & 0x7FFFFFFF for r in rows], dtype=np.int64)
    m = np.array(rows, dtype=float).reshape(len(rows), len(_READ))
    row_key = np.array(row_host, dtype=np.int64) * _GPUS + m[:, _IDX].astype(np.int64)
    new: dict[str, SubjectState] = {}
    alerts: list[Alert] = []
    held: dict[str, list[int]] = {}  # alertname -> row keys of this batch's GPUs that hold state for it
    for h, st in state.items():
        if st.alerts and h in host_num:
            for k in st.alerts:
                gpu, _, name = k.partition("/")
                held.setdefault(name, []).append(host_num[h] * _GPUS + int(gpu))
    for rule in config.rules:
        value, threshold, below, on, off, known = _rule_arrays(rule, m, throttle)
        live = held.get(rule.alertname, [])
        # Only rows of GPUs that are over the threshold now or hold state for this rule need the state machine.
        hot = np.isin(row_key, np.concatenate([row_key[on], np.asarray(live, dtype=np.int64)])) & known
        for r in np.flatnonzero(hot):  # unknown readings (None) never step an alert
            s, g = samples[row_sample[r]], row_gpu[r]
            host, key = s["host"], f"{g['index']}/{rule.alertname}"
            cur = new.get(host) or state.get(host) or SubjectState()
            prior = cur.alerts.get(key)
            if prior is None and not on[r]:
                continue
            st, event = step(prior or AlertState(), s["ts"], float(value[r]), bool(on[r]), bool(off[r]), rule,
                             config.max_gap_s)
            kept = {k: v for k, v in cur.alerts.items() if k != key}
            if st.worth_keeping(s["ts"], rule):
                kept[key] = st
            new[host] = replace(cur, alerts=kept)
            if event:
                alerts.append(_gpu_alert(rule, event, st, s, g, float(threshold[r]), float(below[r])))
    for host, w in wm.items():  # changed hosts, and hosts with live alerts, also record their newest sample time
        cur = new.get(host) or state.get(host)
        if cur is not None and (host in new or cur.alerts) and w > cur.wm:
            new[host] = replace(cur, wm=w)
    severity_of = {rule.alertname: rule.severity for rule in config.rules}
    return Judged(_incidents(alerts, state, new, severity_of), new, reports)


def event_order(a: Alert) -> tuple:
    """Events of one instant: firings before resolves (a condition handing over to another keeps its incident open),
    the most severe first (a warning and a critical crossing together open one incident at critical)."""
    return a.ts, a.status != "firing", -SEVERITY[a.severity]


def _incidents(alerts: list[Alert], state: Mapping[str, SubjectState], new: dict[str, SubjectState],
               severity_of: Mapping[str, str]) -> list[Alert]:
    """The conditions' events in order, each GPU's incident folded through them (incident_step). Folded event by
    event, so it gives the same pages whatever the batches."""
    out: list[Alert] = []
    for a in sorted(alerts, key=event_order):
        cur = new.get(a.host) or state.get(a.host) or SubjectState(incidents={})
        if cur.incidents is None:  # state from before incidents: what fired before this batch is the open incident
            cur = replace(cur, incidents=_rebuilt(state.get(a.host) or SubjectState(), severity_of))
        gpu = str(a.gpu_index)
        inc, events = incident_step(cur.incidents.get(gpu), a, INCIDENT,
                                    fingerprint(INCIDENT, host=a.host, gpu_index=a.gpu_index))
        out += events
        incidents = {k: v for k, v in cur.incidents.items() if k != gpu}
        new[a.host] = replace(cur, incidents={**incidents, gpu: inc} if inc else incidents)
    return out


def _rebuilt(st: SubjectState, severity_of: Mapping[str, str]) -> dict[str, dict]:
    """The incidents of host state written before incidents were kept: each GPU's firing conditions, taken as already
    paged (each paged on its own then)."""
    firing: dict[str, dict[str, AlertState]] = {}
    for key, alert in st.alerts.items():
        gpu, _, name = key.partition("/")
        if alert.firing and name in severity_of:
            firing.setdefault(gpu, {})[name] = alert
    return {gpu: rebuilt_incident(states, severity_of) for gpu, states in firing.items()}


def rebuilt_incident(firing: Mapping[str, AlertState], severity_of: Mapping[str, str]) -> dict | None:
    """One subject's incident from its firing conditions (state written before incidents were kept)."""
    conditions = {name: severity_of[name] for name in firing if name in severity_of}
    if not conditions:
        return None
    level = _level(conditions)
    since = min(st.starts_at for st in firing.values()) if level else None
    return {"conditions": conditions, "open_since": since, "paged": level}


def _level(conditions: Mapping[str, str]) -> str | None:
    """The severity an incident pages at: its most severe firing condition; info conditions alone page nobody."""
    top = max(conditions.values(), key=SEVERITY.__getitem__, default=None)
    return top if top is not None and SEVERITY[top] > SEVERITY["info"] else None


def incident_step(inc: dict | None, a: Alert, name: str, fp: str) -> tuple[dict | None, list[Alert]]:
    """One condition event `a` through its subject's incident `inc` ({"conditions" {alertname: severity} firing,
    "open_since" (None while only info conditions fire), "paged" the severity last paged}; None: nothing firing).
    Returns the incident after it and the alerts to send: the condition labelled with its incident (and
    `inhibited_by` under a more severe one), then the incident's own event when it opened, escalated above what it
    last paged, or resolved. `paged` follows the conditions down as they resolve, so a critical condition that
    returns while a warning has kept the incident open pages again."""
    conditions = dict(inc["conditions"]) if inc else {}
    top = max(conditions, key=lambda n: SEVERITY[conditions[n]], default=None)
    labels = {**a.labels, "incident": fp}
    if a.status == "firing" and top is not None and SEVERITY[conditions[top]] > SEVERITY[a.severity]:
        labels["inhibited_by"] = top
    out = [a.model_copy(update={"labels": labels})]
    if a.status == "firing":
        conditions[a.alertname] = a.severity
    else:
        conditions.pop(a.alertname, None)
    was, level = (inc or {}).get("paged"), _level(conditions)
    since = (inc or {}).get("open_since")
    if level is None:
        if was is not None:
            out.append(_incident(a, name, fp, "resolved", was, since, {}, None))
        return ({"conditions": conditions, "open_since": None, "paged": None} if conditions else None), out
    if was is None:
        since = a.starts_at if a.status == "firing" else a.ts
        out.append(_incident(a, name, fp, "firing", level, since, conditions, None))
    elif SEVERITY[level] > SEVERITY[was]:
        out.append(_incident(a, name, fp, "firing", level, since, conditions, was))
    return {"conditions": conditions, "open_since": since, "paged": level}, out


def _incident(a: Alert, name: str, fp: str, status: str, severity: str, starts_at: float,
              conditions: dict[str, str], was: str | None) -> Alert:
    subject = f"rack {a.rack}" if a.gpu_index is None else f"{a.host} GPU {a.gpu_index}"
    names = ", ".join(f"{n} ({s})" for n, s in sorted(conditions.items(), key=lambda kv: -SEVERITY[kv[1]]))
    if status == "resolved":
        summary = f"{subject}: incident over (last condition {a.alertname} resolved); started {starts_at:.0f}"
    else:
        why = f"escalated from {was} by {a.alertname}" if was else f"opened by {a.alertname}"
        summary = f"{subject}: {names}; {why}; since {starts_at:.0f}"
    return a.model_copy(update={
        "fingerprint": fp, "status": status, "alertname": name, "severity": severity, "starts_at": starts_at,
        "ends_at": a.ts if status == "resolved" else None, "summary": summary,
        "labels": {**{k: v for k, v in a.labels.items() if k != "inhibited_by"}, "conditions": ",".join(conditions),
                   "moved_by": a.alertname},
        "evidence": {**a.evidence, "conditions_firing": float(len(conditions))}})


def _gpu_alert(rule: Rule, event: str, st: AlertState, s: dict, g: dict, threshold: float, below: float) -> Alert:
    idx, host, value = g["index"], s["host"], st.last_value
    evidence = {f: float(g[f]) for f in (*FIELDS, "throttle_reasons") if g.get(f) is not None}
    evidence.update(threshold=threshold, resolve_below=below, dwell_s=rule.dwell_s,
                    resolve_s=rule.resolve_hold(st.flaps), flaps=float(st.flaps), seq=float(s.get("seq", 0)))
    if rule.shown:
        shown = rule.shown.format(**g)
    elif rule.bit:
        shown = f"throttle reasons 0x{g['throttle_reasons']:x}, bit 0x{rule.bit:x} {'set' if value else 'clear'}"
    else:
        shown = f"{rule.signal} {value:g} vs threshold {threshold:g}"
    verb = "since" if event == "firing" else "resolved; started"
    return Alert(
        fingerprint=fingerprint(rule.alertname, host=host, gpu_index=idx), status=event, alertname=rule.alertname,
        severity=rule.severity, ts=s["ts"], starts_at=st.starts_at, ends_at=s["ts"] if event == "resolved" else None,
        host=host, rack=s.get("rack", ""), gpu_index=idx, value=value, threshold=threshold,
        summary=f"{host} GPU {idx}: {rule.what} ({shown}); {verb} {st.starts_at:.0f}",
        labels={k: str(v) for k, v in (("cluster", s.get("cluster")), ("gpu_uuid", g.get("uuid")),
                                        ("model", g.get("model")), ("job", s.get("job")), ("stage", "power_thermal"))
                if v},
        evidence=evidence,
    )
