"""A GPU whose corrected memory errors climb is suspect long before it fails (the gray failure a level threshold misses:
DCGM issue 313's GPU was reported healthy while its corrected errors rose by thousands a second).

Per GPU, two moving averages of its corrected-error rate, one short (`trend_fast_s`, 30 min) and one long
(`trend_slow_s`, 6 h), each the plain mean of everything seen while the GPU's history is shorter than its span (no
start-up bias), so a steady trickle (some healthy GPUs log a few an hour for months) keeps them equal. The GPU is suspect when the short one is at least `trend_min_per_h`, at least
`trend_growth` times the long one, and above it by `trend_sigma` standard deviations of Poisson counts: a climb, not
noise. Updated only when the count moves, so a quiet GPU costs nothing. A suspect is not a drain at once: its fault
event asks for a drain once the node's job is done (evidence `mode` after_jobs), and it is told once until a reset."""

from __future__ import annotations

import math

from schemas.analytics import FaultBin
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import Finding, GpuMemo

EPISODE = "ecc_trend"


def corrected(g: dict) -> int | None:
    """The GPU's corrected-error count: lifetime (aggregate, kept across reboots) where it reports one."""
    agg = g.get("ecc_sbe_aggregate")
    return agg if agg is not None else g.get("ecc_sbe_volatile")


def trend_findings(key: str, g: dict, memo: GpuMemo, ts: float, host: str, config: FaultBinConfig) -> list[Finding]:
    """Fold the GPU's corrected-error count into its averages (memo.tr = [ts, count, fast, slow, since], rates per
    second, since: its first reading); the finding the one time a climb makes it suspect. Call it when the count
    moved (or was never seen)."""
    count = corrected(g)
    if count is None:
        return []
    tr = memo.tr
    if not tr or count < tr[1] or ts <= tr[0]:  # first seen, or a counter that went back (a new card, a reset)
        memo.tr = [ts, count, 0.0, 0.0, ts]
        return []
    dt, elapsed = ts - tr[0], ts - tr[4]
    rate = (count - tr[1]) / dt
    # an exponential average, or the plain mean of the whole history while it is shorter than the average's span
    fast = tr[2] + max(1.0 - math.exp(-dt / config.trend_fast_s), dt / elapsed) * (rate - tr[2])
    slow = tr[3] + max(1.0 - math.exp(-dt / config.trend_slow_s), dt / elapsed) * (rate - tr[3])
    memo.tr = [ts, count, fast, slow, tr[4]]
    spread = math.sqrt(fast / (2.0 * config.trend_fast_s) + slow / (2.0 * config.trend_slow_s))
    z = (fast - slow) / spread if spread > 0 else 0.0
    climbing = fast * 3600.0 >= config.trend_min_per_h and fast >= config.trend_growth * slow and \
        z >= config.trend_sigma
    if not climbing or EPISODE in memo.ep:
        return []
    memo.ep[EPISODE] = [ts, 1, True]  # told; forgotten on a reset (GpuMemo.rebooted)
    per_h, base_h = fast * 3600.0, slow * 3600.0
    why = (f"{host} GPU {key}: corrected ECC errors climbing: {per_h:,.0f} an hour over the last "
           f"{config.trend_fast_s / 60:g} min against {base_h:,.0f} an hour over {config.trend_slow_s / 3600:g} h "
           f"(x{per_h / base_h if base_h else math.inf:.1f}, {z:.1f} sigma; {count:,} in all): its memory is degrading "
           f"before it fails; suspect: drain it once its job is done, never at once")
    evidence = {"pci": str(g.get("pci_bus_id")), "mode": "after_jobs", "field": "ecc_sbe_aggregate"
                if g.get("ecc_sbe_aggregate") is not None else "ecc_sbe_volatile", "count": str(count),
                "per_h_fast": f"{per_h:.1f}", "per_h_slow": f"{base_h:.1f}", "sigma": f"{z:.2f}",
                "fast_s": f"{config.trend_fast_s:g}", "slow_s": f"{config.trend_slow_s:g}",
                "remapped_rows_correctable": str(g.get("remapped_rows_correctable")),
                "remap_banks_low_none": f"{g.get('remap_banks_low')}/{g.get('remap_banks_none')}"}
    return [Finding(key, EPISODE, FaultBin.INSPECT.value, "trend_ecc", "DRAIN_WHEN_IDLE", 1, [why], evidence,
                    g["index"], g.get("uuid"))]
