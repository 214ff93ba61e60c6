"""Fault bins: XID/SXid lines and counter faults -> catalog bin, workflow codes, history escalation, storm dedup."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from schemas.analytics import FaultBin, FaultEvent
from schemas.topics import HOST_EVENTS, NET, SAMPLES, XID
from schemas.xid_catalog import RECOVERY_ACTIONS, first_bin, lookup
from streams.fault_bins.counters import apply_sample, rate_rules
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_rules import apply_net, host_event_finding
from streams.fault_bins.host_state import Finding, GpuMemo, HostState, close_due, norm_pci, record

FATAL = frozenset({FaultBin.RESET.value, FaultBin.REBOOT.value})
FOLLOWERS = frozenset({"workflow_45", "workflow_154"})  # bins that echo another Xid: that Xid escalates, not these
RULES = {"WORKFLOW_XID_45": "workflow_45", "WORKFLOW_NVLINK5_ERR": "workflow_nvlink5", "XID_154": "workflow_154",
         "WORKFLOW_NVLINK_ERR": "workflow_nvlink", "WORKFLOW_XID_48": "workflow_48", "UNKNOWN": "unknown_code"}
# What the line says when a producer left the parsed field empty (the parser's own patterns, REFERENCE.md §2).
_SEVERITY_74 = re.compile(r"NVLink: (?P<sev>[Nn]on-?fatal|[Ff]atal) error")
_CAUSED = re.compile(r"caused by previous Xid (?P<xid>\d+)")
_RECOVERY = re.compile(r"GPU recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<new>[0-9a-fA-F]+)")
Record = tuple[str, dict]  # ("xid" | "sample" | "net" | "host_event", checked record)
CHECKS = {"xid": XID, "sample": SAMPLES, "net": NET, "host_event": HOST_EVENTS}
DEFAULTS = FaultBinConfig()


@dataclass
class Binned:
    """What evaluate() made of a batch: the fault events to send, the state to keep, and counts of what it did."""

    faults: list[FaultEvent]
    state: dict[str, HostState]  # the hosts whose state is worth writing
    stats: Counter = field(default_factory=Counter)  # applied / replayed records, occurrences, findings by rule


def _is_nonfatal(severity: str | None) -> bool:
    return severity is not None and severity.replace("-", "").lower().startswith("nonfatal")


def _gpu_of(st: HostState, ev: dict) -> tuple[str, int | None, str | None]:
    """The GPU key an Xid belongs to: its index (learning its PCI id), else a GPU known by that PCI id."""
    pci = norm_pci(ev.get("pci_bus_id"))
    if ev.get("kind", "xid") == "sxid":
        return f"nvswitch:{pci or '?'}", None, None
    index, uuid = ev.get("gpu_index"), ev.get("gpu_uuid")
    if index is not None:
        memo = st.memo(str(index))
        memo.pci, memo.uuid = memo.pci or pci, memo.uuid or uuid
        return str(index), index, uuid or memo.uuid
    if pci:
        for key, memo in st.gpus.items():
            if key.isdigit() and memo.pci == pci:
                return key, int(key), uuid or memo.uuid
        return f"pci:{pci}", None, uuid
    return "host", None, uuid


def xid_finding(st: HostState, host: str, ev: dict, config: FaultBinConfig) -> Finding:
    """The catalog's first answer for one XID/SXid line, with the workflow codes resolved from the line itself."""
    kind, code = ev.get("kind", "xid"), ev["code"]
    gpu, index, uuid = _gpu_of(st, ev)
    severity, caused_by, action_now = ev.get("severity"), ev.get("caused_by"), ev.get("recovery_action")
    message = ev.get("message") or ""
    if kind == "xid" and code == 74 and severity is None and (m := _SEVERITY_74.search(message)):
        severity = m.group("sev")
    if kind == "xid" and code == 45 and caused_by is None and (m := _CAUSED.search(message)):
        caused_by = int(m.group("xid"))
    if kind == "xid" and code == 154 and action_now is None and (m := _RECOVERY.search(message)):
        action_now = int(m.group("new"), 16)
    bin_, action = first_bin(code, kind, severity=severity, caused_by=caused_by, recovery_action=action_now)
    entry = lookup(code) if kind == "xid" else None
    name = f"{'SXid' if kind == 'sxid' else 'Xid'} {code}" + (f" ({entry.mnemonic}: {entry.description})"
                                                               if entry else "")
    rule = "sxid" if kind == "sxid" else RULES.get(action, "catalog")
    if rule == "workflow_45":
        why = (f"{name} caused by previous Xid {caused_by}: follows Xid {caused_by}" if caused_by is not None else
               f"{name} names no cause: cleanup after another Xid, which carries the bin")
    elif rule == "workflow_154":
        why = (f"{name}: GPU recovery action changed to 0x{action_now:x} "
               f"({RECOVERY_ACTIONS.get(action_now, 'undefined')})" if action_now is not None else
               f"{name} without a readable recovery action")
    elif rule == "workflow_nvlink" and _is_nonfatal(severity):
        bin_, why = FaultBin.IGNORE, f"{name}: the line says the NVLink error is {severity}"
    elif rule in ("workflow_nvlink", "workflow_nvlink5"):
        unit = f" unit {ev['unit']}" if ev.get("unit") else ""
        why = f"{name}{unit}, {severity or 'severity not stated'}, link {ev.get('link')}"
    elif rule == "unknown_code":
        why = f"{name} is not in NVIDIA's catalog: someone must look"
    else:
        why = f"{name}: catalog immediate action {action}"
    evidence = {"code": str(code), "kind": kind, "pci": str(ev.get("pci_bus_id")), "source": str(ev.get("source")),
                "message": message[:config.evidence_chars], "xid_ts": f"{ev['ts']:.6f}"}
    said = {"severity": severity, "caused_by": caused_by, "recovery_action": action_now}
    for name_ in ("severity", "unit", "link", "caused_by", "recovery_action", "pid", "process", "gpu_instance"):
        value = said[name_] if name_ in said else ev.get(name_)
        if value is not None:
            evidence[name_] = str(value)
    return Finding(gpu, f"{kind}:{code}", FaultBin(bin_).value, rule, action, ev.get("count") or 1,
                   [f"{why} -> {FaultBin(bin_).value}"], evidence, index, uuid)


def escalate(memo: GpuMemo, f: Finding, ts: float, config: FaultBinConfig) -> Finding:
    """History: the same fatal fault N times in a window, or a fatal fault after K reboots, means replace."""
    if f.bin not in FATAL:
        return f
    memo.fatal = True
    if f.rule in FOLLOWERS or f.gpu.startswith(("nvswitch:", "host")):
        return f
    hist = [t for t in memo.hist.get(f.code, []) if ts - t < config.repeat_window_s]
    if not hist or ts - hist[-1] >= config.incident_gap_s:  # a burst of lines is one incident
        hist.append(ts)
    limit = config.repeat_limit(f.code)
    memo.hist[f.code] = hist[-limit:]
    reboots = [r for r in memo.reboots if ts - r[0] < config.reboots_window_s]
    if len(hist) >= limit:
        why = (f"{f.code} on GPU {f.gpu} {len(hist)} times within {config.repeat_window_s / 3600:g} h "
               f"(limit {limit}; lines within {config.incident_gap_s:g} s count once) -> replace")
        return replace(f, bin=FaultBin.REPLACE.value, rule="escalation_repeat", reasons=[*f.reasons, why],
                       evidence={**f.evidence, "repeats": str(len(hist)), "repeat_limit": str(limit),
                                 "incidents": ",".join(f"{t:.3f}" for t in hist)})
    if len(reboots) >= config.reboots_k:
        why = (f"{f.code} on GPU {f.gpu} again after {len(reboots)} reboots that each followed a fatal fault "
               f"(limit {config.reboots_k}) -> replace")
        return replace(f, bin=FaultBin.REPLACE.value, rule="escalation_reboots", reasons=[*f.reasons, why],
                       evidence={**f.evidence, "reboots": "; ".join(f"{r[0]:.3f}: {r[1]}" for r in reboots)})
    return f


def _digest(ev: dict) -> str:
    ident = (f"{ev['ts']!r}|{ev.get('kind')}|{ev['code']}|{ev.get('pci_bus_id')}|{ev.get('gpu_index')}|"
             f"{ev.get('message')}|{ev.get('raw_line')}|{ev.get('count')}|{ev.get('source')}")
    return hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()


def _host_digest(ev: dict) -> str:
    ident = (f"{ev['ts']!r}|{ev['subsystem']}|{ev['code']}|{ev.get('device')}|{ev.get('message')}|"
             f"{ev.get('raw_line')}|{ev.get('count')}|{ev.get('source')}")
    return hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()


def _fresh(wm: float, digests: dict[str, float], ts: float, digest: str, config: FaultBinConfig
           ) -> tuple[float, dict[str, float]] | None:
    """Replay guard of one event stream: None when older than its newest applied event by more than the slack, or a
    digest already applied; else the stream's new watermark and digests."""
    if ts < wm - config.xid_replay_slack_s or digest in digests:
        return None
    wm = max(wm, ts)
    digests[digest] = ts
    floor = wm - config.xid_replay_slack_s
    digests = {d: t for d, t in digests.items() if t >= floor}
    if len(digests) > config.xid_digests_max:
        digests = dict(sorted(digests.items(), key=lambda kv: kv[1])[-config.xid_digests_max:])
    return wm, digests


def _fresh_xid(st: HostState, ev: dict, config: FaultBinConfig) -> bool:
    if (fresh := _fresh(st.xwm, st.digests, ev["ts"], _digest(ev), config)) is None:
        return False
    st.xwm, st.digests = fresh
    return True


def _fresh_host_event(st: HostState, ev: dict, config: FaultBinConfig) -> bool:
    if (fresh := _fresh(st.hwm, st.hdigests, ev["ts"], _host_digest(ev), config)) is None:
        return False
    st.hwm, st.hdigests = fresh
    return True


def _replayed(st: HostState, kind: str, r: dict, config: FaultBinConfig) -> bool:
    """A record the state has already applied: a sample or port sample at or before its watermark, an event seen."""
    if kind == "sample":
        return r["ts"] <= st.swm
    if kind == "net":
        return r["ts"] <= st.nwm
    if kind == "xid":
        return not _fresh_xid(st, r, config)
    return not _fresh_host_event(st, r, config)


def evaluate(records: Sequence[Record], state: Mapping[str, HostState], config: FaultBinConfig = DEFAULTS,
             *, now: float | None = None, owned: bool = False) -> Binned:
    """Apply a batch of checked XidEvent, HostSample, NetSample and HostEvent dicts, in the order they came, to prior per-host state: the
    same records give the same faults in the same order however they are cut into batches (a sort within a batch
    would order across a boundary differently than inside one).

    Returns the FaultEvents, and the host states worth writing (changed in a way a rule reads, or unwritten for
    state_flush_s); streams.fault_bins.config.rule_table lists the rules. `now` also closes every window ended by
    then, of every host in `state`. The prior states are copied first unless `owned` hands them over.
    """
    hosts: dict[str, HostState] = {}
    out, stats, rules = [], Counter(), rate_rules(config)

    def host_state(host: str) -> HostState:
        if host not in hosts:
            prior = state.get(host)
            hosts[host] = HostState() if prior is None else prior if owned else prior.copy()
        return hosts[host]

    for kind, r in records:
        host, ts = r["host"], r["ts"]
        st = host_state(host)
        if _replayed(st, kind, r, config):
            stats["replayed"] += 1
            continue
        stats[f"applied_{kind}"] += 1
        st.rack = r.get("rack") or st.rack
        st.clock = max(st.clock, ts)
        closed = close_due(st, host, st.clock, config)
        out += closed
        if kind == "sample":
            st.swm = ts
            if r.get("job") != st.job:
                st.job, st.dirty = r.get("job"), True
            findings = apply_sample(st, host, r, config, rules)
        elif kind == "net":
            st.nwm = ts
            findings = apply_net(st, host, r, config)
        elif kind == "xid":
            findings = [xid_finding(st, host, r, config)]
        else:
            findings = [host_event_finding(r, config)]
        st.dirty = st.dirty or kind in ("xid", "host_event") or bool(findings or closed)
        for f in findings:
            if kind in ("sample", "xid"):  # GPU history; the node's recurrence is the lifecycle's (repeat offender)
                f = escalate(st.memo(f.gpu), f, ts, config)
            stats["occurrences"] += f.count
            stats[f"rule_{f.rule}"] += 1
            if (event := record(st, host, f, ts, config)) is not None:
                out.append(event)
    if now is not None:
        for host in {*state, *hosts}:
            st = host_state(host)
            if closed := close_due(st, host, now, config):
                out += closed
                st.dirty = True
    changed = {}
    for host, st in hosts.items():
        if st.dirty or st.clock - st.written >= config.state_flush_s:
            st.written, st.dirty = st.clock, False
            changed[host] = st
    return Binned(out, changed, stats)


def check_record(obj, kind: str) -> Record:
    """An in-memory record of one of the stage's inputs (CHECKS) as the rules take it, checked by its topic's
    validator."""
    return kind, CHECKS[kind].check(obj)
