"""The silence stage: who stopped reporting, whose monitor broke, which job stopped talking (streams/silence/rules.py).

Three steps of one stage, pure and in event time:

- `seen` (lane `telemetry`: host samples, agent status, node states, all keyed by host) keeps each host's last
  sign of life in memory and tells the fleet step about it on the internal single-partition topic silence-fleet:
  at once when a flag changes (a collector failing, a goodbye, out of service), else every `report_s` of the host's
  own time, or of its samples' time (samples read late, behind a status read on time, must reach the fleet step as
  their partition-mates' do). A report carries the host's latest times and only the flags its record proves (the
  worker's memory of a host may be stale); the fleet step keeps its own durable view of the rest.
- `jobs` (lane `nccl`, keyed by job) sends each job's last collective the same way.
- `fleet` (lane `silence`: silence-fleet) holds every host's and job's view (table `hosts`, table `fleet`; every
  report reaches the changelog, about one per host per `report_s`: after a restart it judges from the views it had),
  moves the fleet's clock record by record, and judges (rules.judge) each time the clock crosses a multiple of
  `judge_every_s`: faults for single silent hosts on fleet.faults; RackSilent, FleetSilent, MonitorBroken and
  JobStalled on fleet.alerts.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import orjson

from core.errors import DecodeError
from schemas.codec import encode
from schemas.topics import AGENT, ALERTS, FAULTS, NCCL, NODE_STATE, SAMPLES, SILENCE_FLEET
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step
from streams.silence.rules import FleetClock, HostView, SilenceConfig, judge, merge

HOSTS, FLEET = "hosts", "fleet"
SEEN_FIELDS = {"host": (str,), "alive_ts": (int, float), "sample_ts": (int, float), "rack": (str,), "source": (str,),
               "samples_source": (str,)}
FLAG_FIELDS = {"bye": (bool,), "oos": (bool,), "failing": (dict,), "job": (str, type(None))}  # present when proven
JOB_FIELDS = {"job": (str,), "ts": (int, float)}


def check_fleet(value: object) -> dict:
    """A silence-fleet record: a host's report ({"kind": "host", ...}) or a job's last collective ("job")."""
    if not isinstance(value, dict) or value.get("kind") not in ("host", "job"):
        raise DecodeError("silence record is not an object of kind host or job")
    for name, types in (SEEN_FIELDS if value["kind"] == "host" else JOB_FIELDS).items():
        if type(value.get(name)) not in types:
            raise DecodeError(f"silence {value['kind']} record: {name} {value.get(name)!r:.80} is not "
                              f"{types[0].__name__}")
    for name, types in FLAG_FIELDS.items() if value["kind"] == "host" else ():
        if name in value and type(value[name]) not in types:
            raise DecodeError(f"silence host record: {name} {value[name]!r:.80} is not {types[0].__name__}")
    if "failing" in value and not all(type(e) is str for e in value["failing"].values()):
        raise DecodeError("silence host record: failing holds a value that is not text")
    return value


def _blank(host: str) -> dict:
    return {"kind": "host", "host": host, "alive_ts": 0.0, "sample_ts": 0.0, "rack": "", "job": None,
            "failing": None, "bye": False, "oos": None, "source": "", "samples_source": "", "lost_gpus": 0,
            "gpus_most": 0}


# What every report carries as this worker read it (times only grow); flags come only from the record (seen_step).
TIMES = ("kind", "host", "alive_ts", "sample_ts", "rack", "source", "samples_source")


def _failing(status: dict, cfg: SilenceConfig) -> dict[str, str]:
    """The collectors a status says fail; with no sample collector running, also those that could not start (NVML
    dead since boot is a probe failure, `unsupported`, not a failing poll)."""
    failing = status["failing"]
    if not any(c in status["collectors"] for c in cfg.monitor_collectors):
        failing = {**failing, **{c: f"unsupported: {why}" for c, why in status["unsupported"].items()
                                 if c in cfg.monitor_collectors}}
    return failing


def seen_step(records: Sequence[Record], state: State, cfg: SilenceConfig) -> list[Emit]:
    """Each record moves its host's sign of life; a report goes out per record that changes a flag, or that moves
    the host, or its samples, `report_s` past its last report (decided record by record: the same reports in any
    batches). A report carries the host's latest times as this worker read them and only the flags the record itself
    proves (a status: failing, goodbye, job; a sample: its job, no goodbye; a node state: in service or not): this
    worker's memory of a host may be stale after its partition went elsewhere and came back; the fleet step keeps
    the rest."""
    hosts: dict[str, dict] = state.memo.setdefault("hosts", {})
    sent: dict[str, tuple] = state.memo.setdefault("sent", {})  # host -> (alive_ts, flags, sample_ts) last reported
    out: list[Emit] = []
    for r in records:
        rec, host = r.value, r.value["host"]
        cur = hosts.get(host) or _blank(host)
        proven: dict = {}
        if r.kind == "node":
            if cur["oos"] and rec["schedulable"]:  # back in service (validated): alive then, silence counts from it
                cur["alive_ts"] = max(cur["alive_ts"], rec["ts"])
            cur["oos"] = proven["oos"] = not rec["schedulable"]
        else:
            source = f"{'samples' if r.kind == 'sample' else 'agent'}:{r.partition}"
            if r.kind == "sample" and rec["ts"] > cur["sample_ts"]:  # samples and status are two topics: each
                cur["sample_ts"], cur["samples_source"] = rec["ts"], source  # in order
                cur["job"] = proven["job"] = rec.get("job")
                # GPUs the host's samples had rows of and its latest has not (fallen off the bus, lost to the
                # driver): counted against the most it ever sent, so a GPU taken out for good counts as lost
                read = rec.get("gpus")
                if read is not None:
                    cur["gpus_most"] = most = max(cur.get("gpus_most", 0), len(read))
                    cur["lost_gpus"] = proven["lost_gpus"] = most - len(read)
            if rec["ts"] >= cur["alive_ts"]:
                cur["alive_ts"], cur["rack"], cur["source"] = rec["ts"], rec["rack"] or cur["rack"], source
                proven["bye"] = cur["bye"] = r.kind != "sample" and rec["state"] == "stopping"
                if r.kind != "sample":
                    cur["failing"] = proven["failing"] = _failing(rec, cfg)
                    if rec.get("job"):
                        cur["job"] = proven["job"] = rec["job"]
        hosts[host] = cur
        last = sent.get(host)
        flags = (cur["rack"], cur["job"], cur["failing"], cur["bye"], cur["oos"], cur.get("lost_gpus", 0))
        if (last is None or last[1] != flags or cur["alive_ts"] - last[0] >= cfg.report_s
                or cur["sample_ts"] - last[2] >= cfg.report_s):  # samples read late, behind a status read on time
            sent[host] = (cur["alive_ts"], flags, cur["sample_ts"])
            report = {k: cur[k] for k in TIMES}
            out.append(Emit(SILENCE_FLEET, host.encode(), orjson.dumps({**report, **proven})))
    return out


def jobs_step(records: Sequence[Record], state: State, cfg: SilenceConfig) -> list[Emit]:
    """Each job's last collective, out when it moves `report_s` past the last report."""
    jobs: dict[str, list[float]] = state.memo.setdefault("jobs", {})  # job -> [last collective, last reported]
    out: list[Emit] = []
    for r in records:
        job, ts = r.value["job"], max(rank["ts"] for rank in r.value["ranks"])
        seen = jobs.setdefault(job, [0.0, -cfg.report_s])
        seen[0] = max(seen[0], ts)
        if seen[0] - seen[1] >= cfg.report_s:
            seen[1] = seen[0]
            out.append(Emit(SILENCE_FLEET, job.encode(), orjson.dumps({"kind": "job", "job": job, "ts": seen[0]})))
    return out


def fleet_step(records: Sequence[Record], state: State, cfg: SilenceConfig) -> list[Emit]:
    """Record by record: fold the report in, move the clock, and judge whenever the clock crosses a `judge_every_s`
    mark (the same marks, so the same judgements, in any batches)."""
    # Copies: scan() lends the stored objects read-only, and a step that raises is retried from the stored state.
    views: dict[str, HostView] = {h: copy.copy(v) for h, v in state.scan(HOSTS).items()}
    jobs: dict[str, dict] = {k[4:]: v for k, v in state.scan(FLEET, "job:").items()}
    groups: dict[str, dict] = state.get(FLEET, "groups", {})
    clock_of = state.memo.get("clock")
    if clock_of is None:
        clock_of = state.memo["clock"] = FleetClock(views)
        state.memo["progress"] = {}
        for v in views.values():
            _progress(state.memo["progress"], v)
    progress: dict[str, float] = state.memo["progress"]
    clock = state.get(FLEET, "clock", 0.0)
    changed: set[str] = set()  # hosts reported or judged: durable (a restart must judge from the same views)
    moved: set[str] = set()  # jobs whose view changed
    out: list[Emit] = []
    for r in records:
        rec = r.value
        if rec["kind"] == "job":
            prior = jobs.get(rec["job"], {"ts": 0.0, "stalled_since": None})
            if rec["ts"] > prior["ts"]:
                jobs[rec["job"]] = {**prior, "ts": float(rec["ts"])}
                moved.add(rec["job"])
        else:
            host = rec["host"]
            v = views.get(host) or HostView()
            merge(v, rec)
            changed.add(host)
            views[host] = v
            clock_of.move(host, v)
            _progress(progress, v)
        now = clock_of.read(clock, cfg.clock_quantile)
        if int(now // cfg.judge_every_s) <= int(clock // cfg.judge_every_s) and clock > 0:
            clock = now
            continue
        clock = now
        j = judge(views, jobs, groups, clock, r.ts_ms / 1000.0, cfg, progress)
        groups = j.groups
        changed |= j.changed
        jobs.update(j.jobs)
        moved |= set(j.jobs)
        out += [Emit(FAULTS, f.host.encode(), encode(f), f"fault {f.host} {f.code} -> {f.bin}: {f.reasons[0]}")
                for f in j.faults]
        out += [Emit(ALERTS, (a.host or a.rack or a.labels.get("job") or "fleet").encode(), encode(a),
                     f"{a.alertname} {a.status}: {a.summary}") for a in j.alerts]
    for host in changed:
        state.put(HOSTS, host, views[host])
    for job in moved:
        state.put(FLEET, f"job:{job}", jobs[job])
    if groups != state.get(FLEET, "groups", {}):
        state.put(FLEET, "groups", groups)
    if clock != state.get(FLEET, "clock", 0.0):
        state.put(FLEET, "clock", clock)  # a restart judges at the same marks
    _forget(views, jobs, clock, state, clock_of, cfg)
    return out


def _progress(progress: dict[str, float], v: HostView) -> None:
    """The latest event time read from each source topic-partition (memory; rebuilt from the views)."""
    for source, ts in ((v.source, v.alive_ts), (v.samples_source, v.sample_ts)):
        if source and ts > progress.get(source, 0.0):
            progress[source] = ts


def _forget(views: dict[str, HostView], jobs: dict[str, dict], clock: float, state: State,
            clock_of: FleetClock, cfg: SilenceConfig) -> None:
    """Hosts and jobs not heard from for `forget_after_s`: gone (a decommissioned host, a finished job)."""
    for host, v in views.items():
        if v.alive_ts and clock - v.alive_ts >= cfg.forget_after_s:
            state.delete(HOSTS, host)
            clock_of.drop(host)
    running = {v.job for v in views.values()}
    for job, jv in jobs.items():
        if job not in running and jv.get("stalled_since") is None and clock - jv["ts"] >= cfg.forget_after_s:
            state.delete(FLEET, f"job:{job}")


SETTING = Setting("silence", SilenceConfig, "host silence, broken monitors, job stalls")
STAGE = StageSpec(
    name="silence",
    description="silent hosts (fault, or one rack/fleet alert), broken monitors and stalled jobs: no drain for the "
                "last three",
    steps=(Step("telemetry", (Input(SAMPLES, "sample"), Input(AGENT, "status"), Input(NODE_STATE, "node")),
                seen_step),
           Step("nccl", (Input(NCCL, "nccl"),), jobs_step),
           Step("silence", (Input(SILENCE_FLEET, "fleet", check_fleet),), fleet_step)),
    outputs=(FAULTS, ALERTS, SILENCE_FLEET),
    tables=(StateTable(HOSTS, "each host's last sign of life, flags and judgement (by host)", partitions=1,
                  live=HostView),
            StateTable(FLEET, "the fleet clock, open rack/fleet alerts, each job's last collective", partitions=1)),
    config=SETTING.of,
    settings=(SETTING,),
)
