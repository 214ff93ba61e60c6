"""Rack power budget alerts: the latest GPU power of every host in a rack, summed and held against the rack budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from schemas.analytics import Alert
from schemas.analytics import fingerprint
from streams.power_thermal.rules import (
    RACK_INCIDENT, AlertState, RackReport, Rule, event_order, incident_step, rebuilt_incident, step,
)

RACK_RULES = (
    Rule("RackPowerNearBudget", "warning", "rack_power_w", scale=0.9, margin=0.03, relative_margin=True,
         dwell_s=60, resolve_s=120, what="rack GPU power above 90% of budget"),
    Rule("RackPowerOverBudget", "critical", "rack_power_w", scale=1.0, margin=0.03, relative_margin=True,
         dwell_s=30, resolve_s=120, what="rack GPU power over budget"),
)


@dataclass(frozen=True)
class RackConfig:
    budgets_w: Mapping[str, float] = field(default_factory=dict)  # rack -> watts; a rack not listed never alerts
    rules: tuple[Rule, ...] = RACK_RULES
    stale_s: float = 120.0  # a host silent this long no longer counts toward its rack
    max_gap_s: float = 120.0


@dataclass(frozen=True)
class RackState:
    """Per rack: each host's newest (ts, GPU watts, complete), the rack's alert states by alertname, and its open
    incident (RackIncident over the rack's conditions, as GpuIncident over a GPU's: rules.incident_step)."""

    hosts: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    alerts: dict[str, AlertState] = field(default_factory=dict)
    incident: dict | None = None
    incident_kept: bool = True  # False: written before incidents were kept (rebuilt from the firing conditions)

    def to_json(self) -> dict:
        return {"hosts": {h: list(v) for h, v in self.hosts.items()},
                "alerts": {k: v.to_json() for k, v in self.alerts.items()}, "incident": self.incident}

    @classmethod
    def from_json(cls, raw: dict | None) -> RackState:
        if not raw:
            return cls()
        return cls({h: (v[0], v[1], bool(v[2])) for h, v in raw["hosts"].items()},
                   {k: AlertState.from_json(v) for k, v in raw["alerts"].items()}, raw.get("incident"),
                   "incident" in raw)


def evaluate_racks(reports: Sequence[RackReport], state: Mapping[str, RackState], config: RackConfig):
    """Apply host power reports to prior rack state; returns (alerts, changed rack states).

    The sum over hosts with a GPU of unknown power is a lower bound: it can fire an alert (the true draw is at
    least that) but never resolve one.
    """
    new: dict[str, RackState] = {}
    alerts: list[Alert] = []
    for rep in sorted(reports, key=lambda r: r.ts):
        budget = config.budgets_w.get(rep.rack)
        cur = new.get(rep.rack) or state.get(rep.rack) or RackState()
        prev = cur.hosts.get(rep.host)
        if budget is None or (prev is not None and rep.ts <= prev[0]):
            continue  # no budget, or a replayed / out-of-order report
        hosts = {h: v for h, v in cur.hosts.items() if v[0] >= rep.ts - config.stale_s}
        hosts[rep.host] = (rep.ts, rep.power_w, rep.complete)
        power = np.fromiter((v[1] for v in hosts.values()), dtype=float, count=len(hosts))
        total, complete = float(power.sum()), all(v[2] for v in hosts.values())
        kept, incident, events = dict(cur.alerts), cur.incident, []
        if not cur.incident_kept:
            incident = rebuilt_incident({n: st for n, st in cur.alerts.items() if st.firing},
                                        {rule.alertname: rule.severity for rule in config.rules})
        for rule in config.rules:
            threshold = budget * rule.scale
            below = threshold - rule.margin * budget
            on, off = total >= threshold, complete and total < below
            prior = kept.get(rule.alertname)
            if (prior is None and not on) or not (on or complete):
                continue  # nothing pending, or an incomplete sum under the threshold says nothing
            if prior is not None and rep.ts <= prior.last_ts:
                continue
            st, event = step(prior or AlertState(), rep.ts, total, on, off, rule, config.max_gap_s)
            if st.worth_keeping(rep.ts, rule):
                kept[rule.alertname] = st
            else:
                kept.pop(rule.alertname, None)
            if event:
                events.append(_rack_alert(rule, event, st, rep, hosts, budget, threshold, below, complete))
        for condition in sorted(events, key=event_order):  # one report's events: as incident_step wants them
            incident, sent = incident_step(incident, condition, RACK_INCIDENT,
                                           fingerprint(RACK_INCIDENT, rack=rep.rack))
            alerts += sent
        new[rep.rack] = RackState(hosts, kept, incident)
    return alerts, new


def _rack_alert(rule: Rule, event: str, st: AlertState, rep: RackReport, hosts: dict, budget: float,
                threshold: float, below: float, complete: bool) -> Alert:
    evidence = {f"power_w.{h}": v[1] for h, v in sorted(hosts.items())}
    evidence.update(rack_power_w=st.last_value, budget_w=budget, threshold=threshold, resolve_below=below,
                    hosts=float(len(hosts)), complete=float(complete), dwell_s=rule.dwell_s,
                    resolve_s=rule.resolve_hold(st.flaps), flaps=float(st.flaps))
    verb = "since" if event == "firing" else "resolved; started"
    return Alert(
        fingerprint=fingerprint(rule.alertname, rack=rep.rack), status=event, alertname=rule.alertname,
        severity=rule.severity, ts=rep.ts, starts_at=st.starts_at, ends_at=rep.ts if event == "resolved" else None,
        rack=rep.rack, value=st.last_value, threshold=threshold,
        summary=(f"rack {rep.rack}: {rule.what} ({st.last_value:.0f} W of {budget:.0f} W over {len(hosts)} hosts"
                 f"{'' if complete else ', some GPU power unknown'}); {verb} {st.starts_at:.0f}"),
        labels={"stage": "power_thermal", "budget_w": f"{budget:g}"},
        evidence=evidence,
    )
