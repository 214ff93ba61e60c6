"""What silence means: pure rules over the fleet's view of who still reports, in event time.

Each host's view (`HostView`) holds when it was last heard from (a sample or an agent status, `alive_ts`), its last
sample, its rack and job, the collectors its agent says fail, whether it said goodbye (an orderly stop) and whether
it is out of service (drained, in repair: silence expected). Each job's view holds its last collective.

The fleet's clock is a high quantile of the hosts' `alive_ts`, never going back: a few hosts whose clocks run ahead
do not move it, and it keeps running while most of the fleet reports. A host heard from `silent_after_s` before the
clock, without a goodbye and in service, is silent. Once it has been silent `group_wait_s` longer (the rest of its
rack, whose samples are staggered over an interval, has then crossed the line too) it is judged once:

- most of its rack silent with it (`rack_share`, at least `rack_min_hosts`): the rack's switch or power, one
  RackSilent alert for the rack, no fault, no drain;
- many hosts silent across racks (`fleet_share` of the fleet, at least `fleet_min_hosts`, more than one rack): the
  collector network or the broker, one FleetSilent alert, no drain;
- else: a fault `host_silent` in bin `reboot` (the node drains, a power cycle first), with its evidence; only when
  the hosts behind the clock with it (their wall waits over or not) would not make its rack or the fleet out either,
  and, for a host still dark when its rack's or the fleet's outage ended, `rejoin_s` after that (hosts boot minutes
  apart after a power loss), so no verdict depends on the worker's pace.

A host that still sends agent status but no samples, or whose agent says a collector fails, is a broken monitor:
MonitorBroken, never a drain. A job whose collectives stopped `stall_after_s` before the clock while hosts still
report it in their samples is stalled: JobStalled, naming any hardware evidence among its hosts (silent, broken
monitor); no drain either way (docs/remediation.md, "Host silence, broken monitors and job stalls").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.analytics import Alert, FaultEvent, fingerprint

SILENT_CODE, SILENT_BIN = "host_silent", "reboot"
RACK_SILENT, FLEET_SILENT, MONITOR_BROKEN, JOB_STALLED = "RackSilent", "FleetSilent", "MonitorBroken", "JobStalled"
SINGLE, RACK, FLEET = "host", "rack", "fleet"  # how a silent host was judged
LABELS_MAX = 40  # hosts named in an alert's labels; the count is always whole


class SilenceConfig(BaseModel):
    """Thresholds of the silence rules (event-time seconds). [ours]: three missed 10 s samples plus the agent's
    60 s status period decide silence in a minute; a rack's hosts sample within one interval of each other."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    silent_after_s: float = Field(default=60.0, gt=0, description="no sample or status this long -> silent")
    group_wait_s: float = Field(default=30.0, ge=0, description="then this long before judging, so a rack's or "
                                "fleet's hosts that stopped together are judged together")
    report_s: float = Field(default=20.0, gt=0, description="how often a host's liveness reaches the fleet step "
                            "when nothing else changes; below silent_after_s")
    rack_share: float = Field(default=0.5, gt=0, le=1, description="share of a rack's hosts silent together -> "
                              "the rack, not the hosts")
    rack_min_hosts: int = Field(default=2, ge=2)
    fleet_share: float = Field(default=0.05, gt=0, le=1, description="share of the fleet silent together -> the "
                               "collector network or broker")
    fleet_min_hosts: int = Field(default=4, ge=2)
    clock_quantile: float = Field(default=0.98, gt=0, lt=1, description="the clock is the k-th latest last-heard "
                                  "time of the hosts, k = max(2, (1 - this) x hosts): hosts whose clocks run ahead "
                                  "do not move it")
    wall_wait_s: float = Field(default=10.0, ge=0, description="wall-clock seconds a host behind the clock waits "
                               "before it counts as silent (after an outage agents' spools replay at different "
                               "speeds), report_s more when it was heard from while behind; three times this when "
                               "its topic-partition is not silent_after_s ahead of it (the consumer may fetch one "
                               "partition later than another)")
    stall_after_s: float = Field(default=120.0, gt=0, description="a job without collectives this long while "
                                 "its hosts report -> JobStalled")
    judge_every_s: float = Field(default=5.0, gt=0, description="the rules run each time the clock crosses a "
                                 "multiple of this")
    forget_after_s: float = Field(default=7 * 86_400.0, gt=0, description="a host or job not heard from this long "
                                  "is forgotten")
    monitor_hold_s: float = Field(default=30.0, ge=0, description="a collector failing this long (or an agent "
                                  "speaking without samples) before MonitorBroken fires: one failed poll pages nobody")
    goodbye_s: float = Field(default=3600.0, gt=0, description="how long a goodbye is believed: a host that said it "
                             "stopped and is still silent after this counts as silent")
    rejoin_s: float = Field(default=600.0, ge=0, description="a host still silent when the rest of its silent rack "
                            "(or the fleet) reports again is judged on its own only this much later: after a power "
                            "loss, hosts boot minutes apart")
    monitor_collectors: tuple[str, ...] = ("nvml", "dcgm")  # collectors that produce the samples

    @model_validator(mode="after")
    def _report_within(self) -> SilenceConfig:
        if self.report_s >= self.silent_after_s:
            raise ValueError(f"report_s ({self.report_s}) must be below silent_after_s ({self.silent_after_s})")
        return self


@dataclass
class HostView:
    """One host as the fleet step knows it (the changelog value of table `hosts`)."""

    alive_ts: float = 0.0  # last sample or agent status
    sample_ts: float = 0.0  # last sample; 0: none seen
    rack: str = ""
    job: str | None = None
    failing: dict[str, str] = field(default_factory=dict)
    failing_since: float | None = None  # alive_ts of the first report with a collector failing
    nosample_since: float | None = None  # alive_ts of the first report of a run heard from without new samples
    bye: bool = False  # its agent stopped in order after its last sample
    oos: bool = False  # out of service (drained, repairing): silence expected
    silent_since: float | None = None  # alive_ts when it was found behind the clock (and not heard from since)
    silent_wall: float = 0.0  # the wall clock (Kafka time, s) then
    late: bool = False  # heard from again while behind the clock: alive, its records read late
    source: str = ""  # the topic-partition its latest sign of life came from ("samples:3", "agent:3")
    samples_source: str = ""  # the topic-partition its samples come from
    judged: str | None = None  # SINGLE, RACK or FLEET once judged
    regrouped: float | None = None  # the clock when its rack's or the fleet's outage ended with it still silent
    monitor_since: float | None = None  # MonitorBroken firing since
    lost_gpus: int = 0  # GPUs its samples had rows of (the most it ever sent) that its last sample had not

    def to_json(self) -> dict:
        return asdict(self)

    def copy(self) -> HostView:
        return HostView.from_json(self.to_json())

    @classmethod
    def from_json(cls, raw: Mapping | None) -> HostView:
        raw = dict(raw or {})
        raw["failing"] = dict(raw.get("failing") or {})
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


def merge(view: HostView, report: Mapping) -> None:
    """A host's report from a `seen` step folded into its view; a flag the report leaves out (its record did not
    prove it) keeps the view's. Whether a silent host is back is the clock's to say (judge): a report may carry a
    sign of life older than the silence it seems to end."""
    seen = {**report, "rack": report["rack"] or view.rack, "failing": report.get("failing", view.failing),
            "oos": report.get("oos", view.oos), "job": report.get("job", view.job), "bye": report.get("bye", view.bye)}
    if seen["sample_ts"] > view.sample_ts or seen["bye"]:
        view.nosample_since = None
    elif seen["alive_ts"] > max(view.alive_ts, seen["sample_ts"]) and (view.nosample_since is None or view.bye):
        view.nosample_since = seen["alive_ts"]  # its agent speaks, its samples do not (yet); or it is back
    if seen["alive_ts"] > view.alive_ts:
        view.alive_ts, view.bye = seen["alive_ts"], seen["bye"]
        view.source = seen.get("source") or view.source
    view.samples_source = seen.get("samples_source") or view.samples_source
    view.sample_ts = max(view.sample_ts, seen["sample_ts"])
    view.rack, view.job, view.failing, view.oos = seen["rack"], seen["job"], dict(seen["failing"]), seen["oos"]
    view.lost_gpus = int(report.get("lost_gpus", view.lost_gpus))
    if not view.failing:
        view.failing_since = None
    elif view.failing_since is None:
        view.failing_since = view.alive_ts


class FleetClock:
    """The fleet's clock: the k-th latest last-heard time of the in-service hosts, k = max(2, (1 - q) x hosts) (the
    earliest when fewer), never going back. A sorted list moved one host at a time; memory only, rebuilt from the
    views after a restart."""

    def __init__(self, views: dict[str, HostView]):
        self.at: dict[str, float] = {}
        self.times: list[float] = []
        for host, v in views.items():
            self.move(host, v)

    def move(self, host: str, v: HostView) -> None:
        old = self.at.pop(host, None)
        if old is not None:
            del self.times[bisect.bisect_left(self.times, old)]
        if v.alive_ts > 0 and not v.bye and not v.oos:
            self.at[host] = v.alive_ts
            bisect.insort(self.times, v.alive_ts)

    def drop(self, host: str) -> None:
        self.move(host, HostView())

    def read(self, prior: float, q: float) -> float:
        if not self.times:
            return prior
        k = max(2, math.ceil((1 - q) * len(self.times)))
        return max(prior, self.times[max(0, len(self.times) - k)])


@dataclass
class Judgement:
    """What one evaluation decided: faults to publish, alerts to fire or resolve, and the views it changed."""

    faults: list[FaultEvent] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)  # hosts whose view changed
    groups: dict[str, dict] = field(default_factory=dict)  # open group alerts after it (key -> record)
    jobs: dict[str, dict] = field(default_factory=dict)  # job views after it (changed ones)


def _names(hosts: Iterable[str]) -> str:
    names = sorted(hosts)
    return ",".join(names[:LABELS_MAX]) + (f",... ({len(names)})" if len(names) > LABELS_MAX else "")


def judge(hosts: dict[str, HostView], jobs: dict[str, dict], groups: dict[str, dict], clock: float, wall: float,
          cfg: SilenceConfig, progress: Mapping[str, float] | None = None) -> Judgement:
    """Every rule at event time `clock` and wall time `wall`; `progress`: the latest event time read from each
    source topic-partition ("samples:3", "agent:3"; none known: every partition counts as moved on).
    `groups` holds the open RackSilent/FleetSilent alerts (key "rack:<r>" or "fleet")
    and `jobs` each job's view ({"ts": last collective, "stalled_since": ts or None}); both are returned changed."""
    out = Judgement(groups=dict(groups))
    in_service = {h: v for h, v in hosts.items() if _in_service(v, clock, cfg)}
    behind = {h: v for h, v in in_service.items() if clock - v.alive_ts >= cfg.silent_after_s}
    for h, v in hosts.items():
        if v.silent_since is not None and h not in behind:  # back, or gone on purpose
            v.silent_since, v.judged, v.late, v.regrouped = None, None, False, None
            out.changed.add(h)
    for h, v in behind.items():
        if v.silent_since is None or v.alive_ts > v.silent_since:  # behind, or still heard from but late: wait anew
            v.late = v.silent_since is not None
            v.silent_since, v.silent_wall = v.alive_ts, wall
            out.changed.add(h)
    # Behind the fleet's clock is silent once it has been behind for `wall_wait_s` of wall time (a spool replaying
    # after an outage catches up within seconds) and its own topic-partition has moved on without it (one partition's
    # records arrive in order: it is not merely a partition the consumer fetched later); a partition that moved no
    # further (every host on it behind) waits three times as long. No Kafka time (offline): no wall waits.
    moved = (lambda source, ts: progress.get(source, 0.0) - ts >= cfg.silent_after_s) if progress is not None \
        else (lambda source, ts: True)
    # A host heard from again while behind (a spool replaying slowly, a clock running late) waits `report_s` more
    # each time: its next report is due by then.
    silent = {h: v for h, v in behind.items()
              if wall == 0 or (wall - v.silent_wall >= cfg.wall_wait_s + (cfg.report_s if v.late else 0.0)
                               and (moved(v.source, v.alive_ts)
                                    or wall - v.silent_wall >= 3 * cfg.wall_wait_s))}
    racks: dict[str, list[str]] = {}
    for h, v in in_service.items():  # a host without a rack label is a rack of its own
        racks.setdefault(v.rack or f"host:{h}", []).append(h)
    # Silent together: a host already judged on its own (its fault sent) is no part of a later rack or fleet outage.
    together = {h: v for h, v in silent.items() if v.judged != SINGLE}
    rack_out, fleet_out = _outages(together, racks, len(in_service), cfg)
    # The same in event time alone: the hosts behind the clock, whether or not their wall waits are over. A host is
    # judged on its own only when these would not make an outage of its rack or the fleet either: else it waits for
    # them, so its verdict never depends on how fast the worker reads (a rack's hosts on a partition with no other
    # traffic wait three wall waits, its other hosts one).
    behind_together = {h: v for h, v in behind.items() if v.judged != SINGLE}
    rack_maybe, fleet_maybe = _outages(behind_together, racks, len(in_service), cfg)
    due = {h for h, v in silent.items() if clock - v.alive_ts >= cfg.silent_after_s + cfg.group_wait_s}
    _group_alerts(out, hosts, rack_out, racks, behind_together, due, fleet_out, len(in_service), clock, cfg)
    for h, v in sorted(silent.items()):
        if v.judged is not None or h not in due or (v.regrouped is not None and clock - v.regrouped < cfg.rejoin_s):
            continue
        verdict = FLEET if fleet_out else RACK if v.rack in rack_out else SINGLE
        if verdict == SINGLE and (fleet_maybe or v.rack in rack_maybe):
            continue
        v.judged = verdict
        out.changed.add(h)
        if v.judged == SINGLE:
            peers = racks.get(v.rack or f"host:{h}", [])
            reporting = sum(1 for p in peers if p not in silent)
            out.faults.append(_fault(h, v, clock, reporting, len(peers), len(silent), len(in_service), cfg))
    for h, v in hosts.items():
        _monitor(out, h, v, h in behind, h in silent, clock, moved, cfg)
    members: dict[str, list[str]] = {}
    for h, v in hosts.items():
        if v.job is not None and _in_service(v, clock, cfg):
            members.setdefault(v.job, []).append(h)
    for job, jv in jobs.items():
        if job in members or jv.get("stalled_since") is not None:
            _job(out, job, jv, members.get(job, []), hosts, silent, clock, cfg)
    return out


def _outages(together: Mapping[str, HostView], racks: Mapping[str, list[str]], fleet_n: int,
             cfg: SilenceConfig) -> tuple[dict[str, list[str]], bool]:
    """The racks most of whose hosts are among `together` (their hosts in it), and whether the fleet is out."""
    rack_out = {r: [h for h in members if h in together] for r, members in racks.items()}
    rack_out = {r: s for r, s in rack_out.items() if not r.startswith("host:")
                and len(s) >= cfg.rack_min_hosts and len(s) >= cfg.rack_share * len(racks[r])}
    loose = [h for h, v in together.items() if v.rack not in rack_out]
    fleet_out = len(rack_out) >= 2 or (
        len(loose) >= max(cfg.fleet_min_hosts, cfg.fleet_share * fleet_n)
        and len({together[h].rack or f"host:{h}" for h in loose}) > 1)
    return rack_out, fleet_out


def _in_service(v: HostView, clock: float, cfg: SilenceConfig) -> bool:
    """Heard from, in service, and not gone after a goodbye (a goodbye is believed for `goodbye_s`)."""
    return v.alive_ts > 0 and not v.oos and not (v.bye and clock - v.alive_ts < cfg.goodbye_s)


def _group_alerts(out: Judgement, hosts: dict[str, HostView], rack_out: dict[str, list[str]],
                  racks: dict[str, list[str]], behind: dict[str, HostView], due: set[str], fleet_out: bool,
                  fleet_n: int, clock: float, cfg: SilenceConfig) -> None:
    """Fire a rack's (the fleet's) alert when most of it goes silent together, resolve it once that is over. While
    the fleet's fires, no rack's opens (one page for one outage; those already open stay). An alert counts and names
    every host of the outage behind the clock (`behind`), its wall wait over or not: the count is the outage's, not the
    worker's pace. A host judged part of a group that is over, and still silent, is judged again on its own, `rejoin_s`
    after the rest came back."""
    wanted = {f"rack:{r}": (RACK_SILENT, r, [h for h in racks[r] if h in behind], len(racks[r]))
              for r in rack_out if not fleet_out or f"rack:{r}" in out.groups}
    if fleet_out:
        wanted["fleet"] = (FLEET_SILENT, "", list(behind), fleet_n)
    for key, (name, rack, members, total) in wanted.items():
        if key in out.groups or not due.intersection(members):
            continue
        since = min(behind[h].alive_ts for h in members)
        out.groups[key] = {"alertname": name, "rack": rack, "since": since, "hosts": len(members), "of": total}
        where = f"rack {rack}" if rack else f"{len({behind[h].rack for h in members})} racks"
        out.alerts.append(_group_alert("firing", name, rack, since, clock, len(members), total, members, where,
                                       cfg))
    for key, g in list(out.groups.items()):
        if key not in wanted:
            del out.groups[key]
            for h, v in hosts.items():
                if v.judged == (FLEET if key == "fleet" else RACK) and (key == "fleet" or f"rack:{v.rack}" == key) \
                        and v.silent_since is not None:
                    v.judged, v.regrouped = None, clock
                    out.changed.add(h)
            where = f"rack {g['rack']}" if g["rack"] else "the fleet"
            out.alerts.append(_group_alert("resolved", g["alertname"], g["rack"], g["since"], clock, 0, g["of"], [],
                                           where, cfg))


def _group_alert(status: str, name: str, rack: str, since: float, clock: float, n: int, total: int,
                 members: list[str], where: str, cfg: SilenceConfig) -> Alert:
    share = cfg.rack_share if name == RACK_SILENT else cfg.fleet_share
    what = ("its switch, power or uplink, not each host" if name == RACK_SILENT
            else "the collector network or the broker, not the hosts")
    summary = (f"{n} of {total} hosts of {where} silent since {since:.0f} (no sample or agent status for "
               f"{clock - since:.0f} s): {what}; no host is drained for it" if status == "firing"
               else f"{where} reports again (silent since {since:.0f})")
    return Alert(
        fingerprint=fingerprint(name, rack=rack), status=status, alertname=name, severity="critical",
        ts=clock, starts_at=since, ends_at=clock if status == "resolved" else None, rack=rack,
        value=float(n), threshold=max(float(cfg.rack_min_hosts), share * total), summary=summary,
        labels={"stage": "silence", "hosts": _names(members)},
        evidence={"silent_hosts": float(n), "hosts": float(total), "share": share, "silent_after_s": cfg.silent_after_s,
                  "clock": clock})


def _fault(host: str, v: HostView, clock: float, peers_reporting: int, peers: int, fleet_silent: int,
           fleet_n: int, cfg: SilenceConfig) -> FaultEvent:
    silent_s = clock - v.alive_ts
    reasons = [f"no sample or agent status for {silent_s:.0f} s (threshold {cfg.silent_after_s:.0f} s) while "
               f"{peers_reporting} of the other {peers - 1} hosts of rack {v.rack or '?'} still report",
               "no goodbye from its agent: not a planned stop; a hung or powered-off host, or its network",
               f"{fleet_silent} of {fleet_n} hosts silent in the fleet: not a collector-network or broker outage"]
    if v.failing:
        reasons.append(f"its agent's last status: failing {', '.join(sorted(v.failing))}")
    if v.regrouped is not None:
        reasons.append(f"silent with its rack (or the fleet) until that outage ended at {v.regrouped:.0f}, and not "
                       f"back {clock - v.regrouped:.0f} s later (rejoin_s {cfg.rejoin_s:g}): it did not come back "
                       f"with the rest")
    return FaultEvent(
        fault_id=f"{host}/-/{SILENT_CODE}/{SILENT_BIN}/{int(v.alive_ts)}", ts=clock, host=host, rack=v.rack,
        code=SILENT_CODE, bin=SILENT_BIN, rule="silence", first_ts=v.alive_ts, last_ts=clock, reasons=reasons,
        evidence={"last_heard_ts": f"{v.alive_ts:.3f}", "last_sample_ts": f"{v.sample_ts:.3f}",
                  "silent_s": f"{silent_s:.1f}", "silent_after_s": f"{cfg.silent_after_s:g}",
                  "rack_reporting": str(peers_reporting), "rack_hosts": str(peers),
                  "fleet_silent": str(fleet_silent), "fleet_hosts": str(fleet_n), "job": v.job or "",
                  **({"outage_ended_ts": f"{v.regrouped:.3f}"} if v.regrouped is not None else {})})


def _monitor(out: Judgement, host: str, v: HostView, behind: bool, silent: bool, clock: float,
             moved: Callable[[str, float], bool], cfg: SilenceConfig) -> None:
    """MonitorBroken while the agent says a collector fails, or it speaks but the samples of the other hosts of its
    samples partition have gone `silent_after_s` past the later of its last sample and the moment it spoke without
    one (a host back from silence speaks before its first sample; a samples topic read behind the status topic, or
    one of its partitions behind the others, delays its samples and theirs alike). It fires only for a host heard
    from now, or heard from again while behind the clock (its records read late; one behind and not heard from
    since may be dead: silence's to judge), and resolves on evidence: the collectors work,
    or the host is confirmed silent, said goodbye or left service (not because its status is read late)."""
    stale = (v.nosample_since is not None
             and moved(v.samples_source, max(v.sample_ts, v.nosample_since)))
    evidence = bool(v.failing) or stale
    gone = v.bye or v.oos or silent
    start = (v.failing_since or v.alive_ts) if v.failing else v.nosample_since
    held = start is not None and clock - start >= cfg.monitor_hold_s  # no page for one failed poll
    broken = not gone and evidence and (v.monitor_since is not None or (held and (not behind or v.late)))
    if broken == (v.monitor_since is not None):
        return
    out.changed.add(host)
    # It started when the evidence did (the first failing report, or the moment it spoke without samples): the same
    # start whenever the rules run.
    since = start if broken else v.monitor_since
    v.monitor_since = start if broken else None
    what = (f"failing: {'; '.join(f'{c}: {e}' for c, e in sorted(v.failing.items()))}" if v.failing
            else "its collectors say nothing")
    samples = (f"no samples for {v.alive_ts - v.sample_ts:.0f} s while its agent reports" if stale
               else "samples still arrive")
    summary = (f"{host}: the monitor is broken, not the hardware ({what}; {samples}); no drain" if broken
               else f"{host}: its monitor works again")
    out.alerts.append(Alert(
        fingerprint=fingerprint(MONITOR_BROKEN, host=host), status="firing" if broken else "resolved",
        alertname=MONITOR_BROKEN, severity="warning", ts=clock, starts_at=since,
        ends_at=None if broken else clock, host=host, rack=v.rack,
        value=max(0.0, v.alive_ts - v.sample_ts) if v.sample_ts else 0.0, threshold=cfg.silent_after_s,
        summary=summary[:1000],
        labels={"stage": "silence", "failing": ",".join(sorted(v.failing)),
                "samples_collector_failing": str(any(c in v.failing for c in cfg.monitor_collectors)).lower()},
        evidence={"last_sample_ts": v.sample_ts, "last_heard_ts": v.alive_ts, "failing": float(len(v.failing))}))


def _job(out: Judgement, job: str, jv: dict, members: list[str], hosts: dict[str, HostView],
         silent: dict[str, HostView], clock: float, cfg: SilenceConfig) -> None:
    """JobStalled while a job's hosts (`members`, in service) report it and its collectives stopped; resolved when
    they resume or no host runs it any more."""
    reporting = [h for h in members if h not in silent]
    idle_s = clock - jv["ts"]
    stalled = bool(reporting) and idle_s >= cfg.stall_after_s
    if stalled == (jv.get("stalled_since") is not None):
        return
    jv = out.jobs[job] = {**jv, "stalled_since": jv["ts"] if stalled else None}
    since = jv["ts"]
    # Hardware evidence: a host of it silent, with a broken monitor or a lost GPU, or taken out of service while it
    # ran the job (a drained host no longer counts among its members, but its fault is why the job stopped).
    drained = [h for h, v in hosts.items() if v.job == job and v.oos and h not in members]
    evidence_hosts = sorted({*(h for h in members if h in silent), *drained,
                             *(h for h in reporting if hosts[h].monitor_since is not None or hosts[h].failing
                               or hosts[h].lost_gpus)})
    cause = (f"hardware evidence: {_names(evidence_hosts)} silent, out of service, with a broken monitor or a lost "
             "GPU" if evidence_hosts
             else "software (a hang or deadlock) unless hardware evidence joins it: no host of it is silent, out of "
                  "service, broken or short of a GPU")
    summary = (f"job {job}: no collective for {idle_s:.0f} s while {len(reporting)} of its {len(members)} hosts "
               f"report it; {cause}; no drain" if stalled
               else f"job {job}: collectives resumed" if reporting and idle_s < cfg.stall_after_s
               else f"job {job}: no host runs it any more")
    out.alerts.append(Alert(
        fingerprint=fingerprint(f"{JOB_STALLED}|job={job}"), status="firing" if stalled else "resolved",
        alertname=JOB_STALLED, severity="warning", ts=clock, starts_at=since, ends_at=None if stalled else clock,
        value=idle_s, threshold=cfg.stall_after_s, summary=summary[:1000],
        labels={"stage": "silence", "job": job, "hosts": _names(members), "cause": "hardware" if evidence_hosts
                else "software", "evidence_hosts": _names(evidence_hosts)},
        evidence={"last_collective_ts": jv["ts"], "idle_s": idle_s, "hosts": float(len(members)),
                  "reporting": float(len(reporting))}))
