"""Faults without an XID, from each GPU's counters against its previous sample: DBE, row remap, rates, lost GPUs, and
(gpu_links.py) its PCIe, NVLink and fabric links."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from schemas.analytics import FaultBin
from schemas.limits import MAX_GPUS
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.gpu_links import link_findings, quiet
from streams.fault_bins.host_state import Finding, GpuMemo, HostState, norm_pci
from streams.fault_bins.trends import corrected, trend_findings

# The GpuReading fields the rules remember, in GpuMemo.last order.
FIELDS = ("ecc_dbe_volatile", "ecc_dbe_aggregate", "pcie_replay_count", "nvlink_crc_errors",
          "nvlink_recovery_errors", "row_remap_pending", "row_remap_failure", "energy_mj", "ecc_sbe_volatile")
DBE_V, DBE_A, PCIE, CRC, RECOVERY, PENDING, FAILURE, ENERGY, SBE_V = range(len(FIELDS))
SINCE_LOAD = (ENERGY, SBE_V, DBE_V)  # counters that only a reboot, reset or driver reload sets back
ERRORS = slice(DBE_V, ENERGY)  # fields whose change may be a fault; energy changes on every sample, SBE often
_READ = itemgetter(*FIELDS)
_KEYS = [str(i) for i in range(MAX_GPUS)]  # GpuMemo keys by GPU index


@dataclass(frozen=True)
class RateRule:
    """More than per_s x window_s increments of `field` within one window of `window_s` seconds -> `bin`. An
    `episode` rule reports a flood that goes on as one incident: it is told again only after two windows without one
    (or after a reset), so a flood that outlasts the drain is not a repeat of itself."""

    code: str
    col: int
    per_s: float
    window_s: float
    bin: str
    action: str
    what: str
    episode: bool = False


def rate_rules(c: FaultBinConfig) -> tuple[RateRule, ...]:
    return (
        RateRule("pcie_replay", PCIE, c.pcie_replay_per_min / 60.0, c.pcie_replay_window_s, FaultBin.INSPECT.value,
                 "CHECK_MECHANICALS", "PCIe replays (link retries: reseat the card, check riser and slot)"),
        RateRule("nvlink_crc", CRC, c.nvlink_crc_per_s, c.nvlink_crc_window_s, FaultBin.INSPECT.value,
                 "INVESTIGATE_LINK_SI", "NVLink CRC errors (link signal integrity)"),
        RateRule("ecc_sbe_flood", SBE_V, c.ecc_sbe_per_s, c.ecc_sbe_window_s, FaultBin.RESET.value, "RESET_GPU",
                 "corrected ECC errors (the GPU's memory is failing while every health check still passes; a reset "
                 "remaps the rows that fail, a flood after it is a card to replace)", episode=True),
        RateRule("nvlink_recovery", RECOVERY, c.nvlink_recovery_max / c.nvlink_recovery_window_s,
                 c.nvlink_recovery_window_s, FaultBin.RESET.value, "WORKFLOW_NVLINK_ERR",
                 "NVLink recovery errors (links retrained; reset the GPU to clear, as for Xid 74)"),
    )


def _finding(key: str, g: dict, code: str, bin_: FaultBin | str, rule: str, action: str, count: int,
             reason: str, **evidence) -> Finding:
    ev = {"pci": str(g.get("pci_bus_id")), **{k: str(v) for k, v in evidence.items()}}
    return Finding(key, code, FaultBin(bin_).value, rule, action, count, [reason], ev, g["index"], g.get("uuid"))


def _reboot_sign(memo: GpuMemo, cur: list, driver_changed: str | None) -> str | None:
    """How a reboot (or GPU reset, or driver reload) shows in a sample: the host's driver version changed, or the
    energy counter or a volatile ECC counter went back (they count since driver load). A lost GPU coming back is
    the other sign, handled by the caller. Reboots feed the 'after K reboots' escalation in streams.fault_bins."""
    if driver_changed:
        return driver_changed
    for col in SINCE_LOAD:
        before, now = memo.last[col], cur[col]
        if before is not None and now is not None and now < before:
            return f"{FIELDS[col]} went back from {before} to {now}"
    return None


def _maybe_back(last: list, cur: list) -> bool:
    """Cheap pre-test for _reboot_sign: False only when every since-load counter is known and did not go back."""
    try:
        return cur[ENERGY] < last[ENERGY] or cur[SBE_V] < last[SBE_V] or cur[DBE_V] < last[DBE_V]
    except TypeError:  # a counter unknown in one of the two readings: let _reboot_sign look
        return True


def _compare(key: str, g: dict, memo: GpuMemo, cur: list, ts: float, rules, host: str) -> list[Finding]:
    """Rules that need the previous reading: new DBEs, remap flags turning on, counter rates."""
    out, last, where = [], memo.last, f"{host} GPU {key}"
    dv, pv, da, pa = cur[DBE_V], last[DBE_V], cur[DBE_A], last[DBE_A]
    new_v = 0 if dv is None or pv is None else (dv if dv < pv else dv - pv)
    new_a = 0 if da is None or pa is None else max(da - pa, 0)
    if max(new_v, new_a) > 0:
        out.append(_finding(key, g, "ecc_dbe", FaultBin.RESET, "counter_dbe", "WORKFLOW_XID_48", max(new_v, new_a),
                            f"{where}: {max(new_v, new_a)} new uncorrectable (double-bit) ECC error(s); a GPU reset "
                            f"clears the error and activates the row remap (as for Xid 48)",
                            ecc_dbe_volatile=f"{pv} -> {dv}", ecc_dbe_aggregate=f"{pa} -> {da}",
                            since=f"{memo.ts:.3f}"))
    out += _flags(key, g, last[PENDING], last[FAILURE], cur, where)
    for rule in rules:
        now, before = cur[rule.col], last[rule.col]
        if now is None or before is None or now == before:
            continue
        if now < before:  # set back by a reset: start counting again from here
            memo.refs[rule.code] = [ts, now]
            continue
        ref = memo.refs.get(rule.code)
        if ref is None or ts - ref[0] > rule.window_s:
            ref = memo.refs[rule.code] = [memo.ts, before]  # a new window starts at the last quiet reading
        grew, span = now - ref[1], ts - ref[0]
        limit = rule.per_s * max(span, rule.window_s)  # readings further apart than a window: the rate over them
        if grew > limit:
            memo.refs[rule.code] = [ts, now]  # the next occurrence needs another `limit` on top
            if rule.episode:
                going = memo.ep.get(rule.code)
                memo.ep[rule.code] = [going[0] if going else ts, (going[1] if going else 0) + 1, ts]
                if going and ts - going[2] <= 2 * rule.window_s:
                    continue  # the same flood, still pouring in
            out.append(_finding(key, g, rule.code, rule.bin, f"counter_{rule.code}", rule.action, 1,
                                f"{where}: {grew:g} {rule.what} in {span:.1f} s, over the limit of {limit:g} "
                                f"({rule.per_s * 60:g}/min over at least {rule.window_s:g} s)",
                                field=FIELDS[rule.col], before=ref[1], after=now,
                                span_s=f"{span:.3f}", limit=f"{limit:g}", rate_window_s=f"{rule.window_s:g}"))
    return out


def _flags(key: str, g: dict, was_pending, was_failed, cur: list, where: str) -> list[Finding]:
    """Row-remap flags that turned on (or are on when the GPU is first seen: they are current hard gates)."""
    out = []
    if cur[PENDING] is True and was_pending is not True:
        out.append(_finding(key, g, "row_remap_pending", FaultBin.RESET, "counter_row_remap", "RESET_GPU", 1,
                            f"{where}: a row remap is pending; it activates on the next GPU reset",
                            row_remap_pending=f"{was_pending} -> True",
                            remapped_rows_uncorrectable=g.get("remapped_rows_uncorrectable")))
    if cur[FAILURE] is True and was_failed is not True:
        out.append(_finding(key, g, "row_remap_failure", FaultBin.REPLACE, "counter_row_remap", "CONTACT_SUPPORT", 1,
                            f"{where}: row remapping failed (no spare row left): an RMA criterion, replace the GPU",
                            row_remap_failure=f"{was_failed} -> True",
                            remapped_rows_uncorrectable=g.get("remapped_rows_uncorrectable")))
    return out


def apply_sample(st: HostState, host: str, s: dict, config: FaultBinConfig,
                 rules: tuple[RateRule, ...] | None = None) -> list[Finding]:
    """One host sample against the host's memory; updates it in place (setting st.dirty when a rule-read value
    changed) and returns what the rules found. `rules`: rate_rules(config), built once per batch by the caller."""
    ts, out, present = s["ts"], [], set()
    rules = rate_rules(config) if rules is None else rules
    driver, driver_changed = s.get("driver_version"), None
    if driver is not None and st.driver is not None and driver != st.driver:
        driver_changed = f"driver version changed from {st.driver} to {driver}"
    if driver is not None and driver != st.driver:
        st.driver, st.dirty = driver, True
    gpus, most_links = st.gpus, None

    def peers(links: int) -> int:
        """The most NVLink links active on a GPU of this sample that has `links` links (computed once, if asked)."""
        nonlocal most_links
        if most_links is None:
            most_links = {}
            for p in s["gpus"]:
                n, m = p.get("nvlink_links"), p.get("nvlink_active_mask")
                if n and m is not None:
                    most_links[n] = max(most_links.get(n, 0), m.bit_count())
        return most_links.get(links, 0)

    for g in s["gpus"]:
        key = _KEYS[g["index"]]
        present.add(key)
        try:
            cur = list(_READ(g))
        except KeyError:  # a reading that leaves optional fields out
            cur = [g.get(f) for f in FIELDS]
        memo, uuid = gpus.get(key), g.get("uuid")
        if memo is None or (memo.uuid and uuid and memo.uuid != uuid):  # new, or another card in this slot
            memo = gpus[key] = GpuMemo()
        last = memo.last
        if memo.lost:
            memo.rebooted(ts, f"returned at {ts:.3f} after being lost since {memo.missing_since:.3f}", config)
        elif last and (driver_changed or _maybe_back(last, cur)) and (sign := _reboot_sign(memo, cur, driver_changed)):
            memo.rebooted(ts, sign, config)
            st.dirty = True
        if not last or memo.miss or cur[ERRORS] != last[ERRORS] or cur[SBE_V] != last[SBE_V]:
            st.dirty = True
            out += _compare(key, g, memo, cur, ts, rules, host) if last else \
                _flags(key, g, None, None, cur, f"{host} GPU {key}")
        if not memo.tr or corrected(g) != memo.tr[1]:  # corrected errors moved: their trend
            out += trend_findings(key, g, memo, ts, host, config)
            st.dirty = True
        if not quiet(g, memo):
            found, changed = link_findings(key, g, memo, ts, host, config, peers, st.rack)
            out += found
            st.dirty = st.dirty or changed
        memo.uuid, memo.pci, memo.ts, memo.last = uuid, norm_pci(g.get("pci_bus_id")), ts, cur
        if memo.miss:  # lost and missing_since are set only while samples miss the GPU
            memo.miss, memo.missing_since, memo.lost = 0, None, False
    for key, memo in st.gpus.items():
        if not memo.last or key in present or not key.isdigit():
            continue
        memo.miss += 1
        memo.missing_since = memo.missing_since or ts
        st.dirty = True
        if memo.miss >= config.lost_after_samples and not memo.lost:
            memo.lost = True
            g = {"index": int(key), "uuid": memo.uuid, "pci_bus_id": memo.pci}
            out.append(_finding(key, g, "gpu_lost", FaultBin.REBOOT, "gpu_lost", "RESTART_BM", 1,
                                f"{host} GPU {key} is missing from {memo.miss} consecutive samples of its host since "
                                f"{memo.missing_since:.3f} (last read {memo.ts:.3f}): lost, as after Xid 79 a node "
                                f"reboot is needed", missing_since=f"{memo.missing_since:.3f}",
                                last_seen=f"{memo.ts:.3f}", samples_missed=memo.miss,
                                gpus_in_sample=len(s["gpus"])))
    return out
