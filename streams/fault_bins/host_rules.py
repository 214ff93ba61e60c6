"""Faults of the host around its GPUs: InfiniBand/RoCE ports (each NetSample against the port's previous reading)
and kernel-log lines about the NIC, disks, filesystems, CPUs and memory (HostEvent), as Findings the fault-bin stage
folds, escalates and emits like the GPU's own.

Ports: a port counts only once it has been seen ACTIVE since the host (re)started, so a port never cabled, or one
still training after a boot, is not a fault. A link that goes down and stays down, one that flaps, one that runs
below the rate it was seen at, and one whose physical-layer error counters climb each have a rule (config.py)."""

from __future__ import annotations

from schemas.analytics import FaultBin
from schemas.network import ERROR_COUNTERS
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import Finding, HostState, PortMemo

# Counters of the physical link: they climb with a dirty connector, a bent cable or a failing transceiver.
PHY_ERRORS = ("symbol_error", "link_error_recovery", "local_link_integrity_errors", "port_rcv_errors",
              "port_rcv_remote_physical_errors")
assert set(PHY_ERRORS) <= set(ERROR_COUNTERS)

# HostEvent code -> (bin, catalog-style action, why). A code not listed is recorded in bin ignore: a producer's
# new pattern must not drain nodes before a rule says what it means.
HOST_EVENT_BINS: dict[str, tuple[FaultBin, str | None, str]] = {
    "mlx5_health_compromised": (FaultBin.REBOOT, "RESET_NIC", "the NIC's firmware reports a fatal error: its links are "
                                "gone until the NIC is reset, which a reboot does"),
    "mlx5_cmd_timeout": (FaultBin.RETRY, None, "commands to the NIC's firmware timed out: often the first sign of a "
                         "failing NIC; recorded, its fatal error or its link going down drains"),
    "mlx5_module_error": (FaultBin.INSPECT, "CHECK_CABLE", "the NIC reports an error of the cable or transceiver "
                          "module: reseat or replace it"),
    "mlx5_cable_unplugged": (FaultBin.IGNORE, None, "the NIC says a port has no cable: a port never cabled says so at "
                             "every boot; the port's readings decide whether a link that was up is gone"),
    "mlx5_pcie_power": (FaultBin.INSPECT, "CHECK_MECHANICALS", "the NIC's PCIe slot gives it too little power"),
    "nic_link_down": (FaultBin.IGNORE, None, "a RoCE link went down: the port's readings decide (ib_link_down, "
                      "ib_link_flap)"),
    "nvme_timeout": (FaultBin.RETRY, None, "an NVMe command timed out and was aborted or the controller reset; "
                     "recorded, the controller failing drains"),
    "nvme_controller_down": (FaultBin.REBOOT, "RESTART_BM", "the NVMe controller is down or was removed: the disk is "
                             "gone until a reboot brings it back"),
    "storage_media_error": (FaultBin.REPLACE, "REPLACE_DISK", "the disk cannot read its own media back: replace it"),
    "block_io_error": (FaultBin.RETRY, None, "a block I/O failed; recorded, a controller or media failure drains"),
    "fs_error": (FaultBin.REBOOT, "FSCK", "the filesystem found corruption: check it offline (fsck at reboot)"),
    "fs_readonly": (FaultBin.REBOOT, "FSCK", "the filesystem shut down or went read-only: jobs cannot write "
                    "checkpoints or logs until it is checked and mounted again"),
    "mce_uncorrected": (FaultBin.INSPECT, "RUN_CPU_MEMORY_DIAG", "an uncorrected machine check (CPU, cache or "
                        "memory): run the vendor's diagnostics before the host takes work again"),
    "mce_corrected": (FaultBin.IGNORE, None, "a corrected machine check: recorded only"),
    "memory_ue": (FaultBin.REPLACE, "REPLACE_DIMM", "an uncorrected memory error on a DIMM: replace the DIMM"),
    "memory_ce": (FaultBin.IGNORE, None, "a corrected memory error: recorded only"),
}
KEY_PREFIX = {"nic": "nic", "storage": "disk", "filesystem": "fs", "machine_check": "mce"}


def _evidence(p: dict, **more) -> dict[str, str]:
    ev = {k: str(p.get(k)) for k in ("device", "port", "pci_bus_id", "netdev", "link_layer", "state", "phys_state",
                                     "rate")}
    return {**ev, **{k: str(v) for k, v in more.items()}}


def _finding(key: str, p: dict, code: str, bin_: FaultBin, action: str | None, reason: str, **more) -> Finding:
    return Finding(f"nic:{key}", code, bin_.value, code, action, 1, [reason], _evidence(p, **more))


def _restarted(memo: PortMemo, p: dict, ts: float, config: FaultBinConfig) -> bool:
    """The port's counters went back (a reboot or a driver reload resets them), or it was not read for port_gap_s
    (the host may have rebooted between two samples)."""
    downed = p.get("link_downed")
    return (memo.downed is not None and downed is not None and downed < memo.downed) or \
        bool(memo.ts and ts - memo.ts > config.port_gap_s)


def apply_net(st: HostState, host: str, s: dict, config: FaultBinConfig) -> list[Finding]:
    """One NetSample against the host's port memory; updates it in place (dirty when a rule-read value changed).

    A sample whose seq went back comes from a restarted agent: every port starts again. A port the host knew ACTIVE
    that the sample leaves out (its NIC fell off the bus, the driver unloaded) counts as down."""
    ts, out = s["ts"], []
    agent_restarted = s["seq"] < st.nseq
    st.nseq = s["seq"]
    present = set()
    for p in s["ports"]:
        key = f"{p['device']}/{p['port']}"
        present.add(key)
        memo = st.ports.get(key)
        if memo is None:
            memo = st.ports[key] = PortMemo()
        before = memo.decisive()
        if agent_restarted or _restarted(memo, p, ts, config):
            memo.restart()
        out += _link(key, p, memo, ts, host, config)
        out += _flap(key, p, memo, ts, host, config)
        out += _phy(key, p, memo, ts, host, config)
        memo.ts = ts
        downed = p.get("link_downed")
        memo.downed = downed if downed is not None else memo.downed
        st.dirty = st.dirty or memo.decisive() != before
    for key, memo in st.ports.items():
        if key in present or not memo.active:
            continue
        if agent_restarted or ts - memo.ts > config.port_gap_s:
            memo.restart()
            st.dirty = True
            continue
        device, _, port = key.rpartition("/")
        gone = {"device": device, "port": port, "state": "missing", "phys_state": None}
        out += _down(key, gone, memo, ts, host, config, "is missing from the host's port sample (its NIC or driver "
                                                             "is gone)")
        st.dirty = True
    return out


def _link(key: str, p: dict, memo: PortMemo, ts: float, host: str, config: FaultBinConfig) -> list[Finding]:
    """Up at a lower rate than the port ran at, or down: each reported once per episode, when it has lasted its
    time (degraded_s, link_down_s) from the first sample that showed it."""
    active = p.get("state") == "ACTIVE" and p.get("phys_state") in (None, "LinkUp")
    rate = p.get("rate_gbps")
    if not active:
        if not memo.active or p.get("state") is None:  # never up since the host started, or unreadable
            return []
        return _down(key, p, memo, ts, host, config, f"is {p.get('state')} ({p.get('phys_state')})")
    memo.active, memo.down, memo.down_since = True, 0, None
    memo.told = [t for t in memo.told if t != "down"]
    if rate is None or not memo.best_gbps or rate >= memo.best_gbps:
        memo.slow, memo.slow_since = 0, None
        memo.told = [t for t in memo.told if t != "slow"]
        memo.best_gbps = max(memo.best_gbps, rate or 0.0)
        return []
    memo.slow += 1
    memo.slow_since = memo.slow_since or ts
    if not _due(memo, "slow", ts - memo.slow_since, config.degraded_s):
        return []
    return [_finding(key, p, "ib_rate_degraded", FaultBin.INSPECT, "CHECK_CABLE",
                     f"{host} port {key} has run at {rate:g} Gb/s since {memo.slow_since:.3f} ({memo.slow} samples), "
                     f"below the {memo.best_gbps:g} Gb/s it ran at: a lane or the speed fell back (cable, transceiver "
                     f"or switch port); jobs over it run slower", best_gbps=memo.best_gbps,
                     slow_since=f"{memo.slow_since:.3f}", samples=memo.slow)]


def _due(memo: PortMemo, episode: str, lasted_s: float, after_s: float) -> bool:
    """An episode ("down", "slow") that has lasted its time is reported once: True the first time."""
    if episode in memo.told or lasted_s < after_s:
        return False
    memo.told.append(episode)
    return True


def _down(key: str, p: dict, memo: PortMemo, ts: float, host: str, config: FaultBinConfig,
          what: str) -> list[Finding]:
    memo.down += 1
    memo.down_since = memo.down_since or ts
    if not _due(memo, "down", ts - memo.down_since, config.link_down_s):
        return []
    return [_finding(key, p, "ib_link_down", FaultBin.INSPECT, "CHECK_CABLE",
                     f"{host} port {key} was ACTIVE and {what}, not ACTIVE in {memo.down} samples since "
                     f"{memo.down_since:.3f}: the link is gone (cable, transceiver, switch port or NIC); collectives "
                     f"over it fail", down_since=f"{memo.down_since:.3f}", samples=memo.down)]


def _flap(key: str, p: dict, memo: PortMemo, ts: float, host: str, config: FaultBinConfig) -> list[Finding]:
    """link_downed grew: the link dropped since the last reading (NVIDIA's NicHealthCheck watches the same counter).
    Each drop crashes the collectives over it; flap_limit within flap_window_s send the port to a person."""
    downed = p.get("link_downed")
    if downed is None or memo.downed is None or downed <= memo.downed:
        return []
    memo.flaps = [t for t in memo.flaps if ts - t < config.flap_window_s] + [ts] * min(downed - memo.downed,
                                                                                       config.flap_limit)
    flaps, now = len(memo.flaps), "back up" if p.get("state") == "ACTIVE" else f"{p.get('state')} now"
    what = (f"{host} port {key} lost its link (link_downed {memo.downed} -> {downed}, {now}): {flaps} drops within "
            f"{config.flap_window_s / 60:g} min")
    if flaps >= config.flap_limit:
        return [_finding(key, p, "ib_link_flap", FaultBin.INSPECT, "CHECK_CABLE",
                         f"{what}, the limit is {config.flap_limit}: a flapping link (cable, transceiver or switch "
                         f"port)", link_downed=downed, flaps=flaps,
                         flap_times=",".join(f"{t:.3f}" for t in memo.flaps))]
    return [_finding(key, p, "ib_link_flap", FaultBin.RETRY, None,
                     f"{what}; {config.flap_limit} drain it", link_downed=downed, flaps=flaps)]


def _phy(key: str, p: dict, memo: PortMemo, ts: float, host: str, config: FaultBinConfig) -> list[Finding]:
    """Physical-layer errors: more than phy_errors_per_min x phy_window_s / 60 between this reading and any
    reading of the last phy_window_s (a window that follows the errors, not a clock grid). Counters compare one by
    one, only where both readings have them: a counter that turns readable is no burst."""
    now = [p.get(name) for name in PHY_ERRORS]
    if all(v is None for v in now):
        return []
    memo.errs = [e for e in memo.errs if ts - e[0] <= config.phy_window_s]
    limit = config.phy_errors_per_min * config.phy_window_s / 60.0
    for then_ts, then in memo.errs:  # oldest first: the largest rise within the window
        rise = [(name, v - w) for name, v, w in zip(PHY_ERRORS, now, then) if v is not None and w is not None]
        if any(d < 0 for _, d in rise):  # a counter went back: readings from before it mean nothing
            memo.errs = []
            break
        errors = sum(d for _, d in rise)
        if errors > limit:
            memo.errs = [[ts, now]]
            detail = ", ".join(f"{name} +{d}" for name, d in rise if d)
            return [_finding(key, p, "ib_phy_errors", FaultBin.INSPECT, "CHECK_CABLE",
                             f"{host} port {key}: {errors} physical-layer errors in {ts - then_ts:.0f} s (more than "
                             f"{limit:g} within {config.phy_window_s:g} s): a degrading cable or transceiver "
                             f"({detail})", errors=errors, window_s=f"{ts - then_ts:.0f}")]
    if memo.errs and memo.errs[-1][1] == now:
        memo.errs[-1][0] = ts  # the same counts again: the newest such reading is the baseline that lasts longest
    else:
        memo.errs.append([ts, now])
    return []


def host_event_finding(ev: dict, config: FaultBinConfig) -> Finding:
    """One kernel-log line about the host, binned by its code (HOST_EVENT_BINS)."""
    code, sub, device = ev["code"], ev["subsystem"], ev.get("device")
    bin_, action, why = HOST_EVENT_BINS.get(code, (FaultBin.IGNORE, None, "a code no rule knows yet: recorded only"))
    where = f" on {device}" if device else ""
    evidence = {"subsystem": sub, "device": str(device), "severity": ev.get("severity", "error"),
                "source": str(ev.get("source")), "message": (ev.get("message") or "")[:config.evidence_chars],
                "raw_line": (ev.get("raw_line") or "")[:config.evidence_chars], "event_ts": f"{ev['ts']:.6f}"}
    return Finding(f"{KEY_PREFIX[sub]}:{device or '?'}", code, bin_.value, "host_event", action, ev.get("count") or 1,
                   [f"{code}{where} ({sub}, {ev.get('severity', 'error')}): {why} -> {bin_.value}"], evidence)
