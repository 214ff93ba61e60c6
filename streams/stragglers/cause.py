"""Why a straggler is slow: its GPU's throttle reasons, temperatures and clocks, kept compact per host and explained."""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter

from schemas.throttle import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from schemas.limits import MAX_GPUS

CAUSES = ((HW_THERMAL, "HW thermal slowdown"), (HW_POWER_BRAKE, "HW power brake slowdown"),
          (HW_SLOWDOWN, "HW slowdown"), (SW_THERMAL, "SW thermal slowdown"), (SW_POWER_CAP, "SW power cap"))
MASK = sum(bit for bit, _ in CAUSES)
FIELDS = ("throttle_reasons", "gpu_temp_c", "hbm_temp_c", "sm_clock_mhz", "power_w", "power_limit_w",
          "slowdown_temp_c", "gpu_max_op_temp_c")
LAST = len(FIELDS)  # then, per cause bit, the newest sample ts with the bit set (None: not seen)


@dataclass(frozen=True)
class CauseConfig:
    """Throttle (clocks-event) bits are NVML's (shared/reference/REFERENCE.md §4; the bits power_thermal reads).

    A host's condition changes in memory with every sample but reaches the changelog only when it changes
    materially (a cause bit flips, a temperature moves by temp_step_c, a GPU appears or goes) or every refresh_s.
    """

    recent_s: float = 120.0  # a cause bit set this long before the window still explains it
    stale_s: float = 120.0  # a condition further than this from the window end is not "now"
    refresh_s: float = 60.0  # changelog record of an unchanged host at least this often
    temp_step_c: float = 2.0


_READ = itemgetter(*FIELDS)
_NEVER = (None,) * len(CAUSES)
_KEYS = [str(i) for i in range(MAX_GPUS)]  # a condition's GPU keys


def update(prior: dict | None, sample: dict) -> dict | None:
    """The host's condition after a checked sample, or None when the sample is not newer than the one held."""
    ts = sample["ts"]
    if prior is not None and ts <= prior["ts"]:
        return None
    old = prior["gpus"] if prior else {}
    gpus = {}
    for g in sample["gpus"]:
        try:
            row = list(_READ(g))
        except KeyError:  # a reading that leaves optional fields out
            row = [g.get(f) for f in FIELDS]
        key = _KEYS[g["index"]]
        was = old.get(key)
        seen = was[LAST:] if was is not None else _NEVER
        bits = (row[0] or 0) & MASK
        row += [ts if bits & bit else seen[i] for i, (bit, _) in enumerate(CAUSES)] if bits else seen
        gpus[key] = row
    return {"ts": ts, "gpus": gpus}


def material(written: dict | None, new: dict, cfg: CauseConfig) -> bool:
    """Whether `new` differs from the condition last written to the changelog enough to write it again."""
    if written is None or new["ts"] - written["ts"] >= cfg.refresh_s or written["gpus"].keys() != new["gpus"].keys():
        return True
    for idx, row in new["gpus"].items():
        was = written["gpus"][idx]
        if (row[0] or 0) & MASK != (was[0] or 0) & MASK:
            return True
        for i in (1, 2):
            if (row[i] is None) != (was[i] is None) or (row[i] is not None and abs(row[i] - was[i]) >= cfg.temp_step_c):
                return True
    return False


def explain(cond: dict | None, host: str, gpu: int | None, start: float, end: float,
            cfg: CauseConfig = CauseConfig()) -> tuple[list[str], dict[str, float]]:
    """Reasons naming the GPU's throttle reasons and temperatures around window [start, end), and their numbers."""
    where = f"{host} GPU {gpu}" if gpu is not None else host
    row = cond["gpus"].get(str(gpu)) if cond and gpu is not None else None
    if row is None:
        return [f"no GPU telemetry from {where} to say why"], {}
    age = end - cond["ts"]
    bits, temp, hbm, clock, power, limit, slowdown, max_op = row[:LAST]
    now = (bits or 0) & MASK if abs(age) <= cfg.stale_s else 0
    recent = 0
    for i, (bit, _) in enumerate(CAUSES):
        last = row[LAST + i]
        if last is not None and start - cfg.recent_s <= last <= end + cfg.stale_s:
            recent |= bit
    evidence = {k: float(v) for k, v in zip(FIELDS, row[:LAST]) if v is not None}
    evidence.update(throttle_reasons_recent=float(recent), gpu_telemetry_age_s=age)
    shown = [f"{name} (0x{bit:x})" for bit, name in CAUSES if now & bit]
    earlier = [f"{name} (0x{bit:x})" for bit, name in CAUSES if recent & bit and not now & bit]
    numbers = [f"{temp:.0f} C" + (f" (slowdown at {slowdown:.0f} C)" if slowdown is not None and now & ~SW_POWER_CAP
                                  else "")] if temp is not None else []
    if hbm is not None and now & SW_THERMAL:
        numbers.append(f"HBM {hbm:.0f} C")
    if power is not None and limit is not None and now & (SW_POWER_CAP | HW_POWER_BRAKE):
        numbers.append(f"{power:.0f} W of {limit:.0f} W limit")
    if clock is not None:
        numbers.append(f"SM clock {clock:.0f} MHz")
    when = "" if abs(age) <= cfg.stale_s else f" (GPU telemetry {abs(age):.0f} s {'before' if age > 0 else 'after'} " \
                                              f"the window end)"
    if shown:
        reason = f"{where} {', '.join(shown)}, {', '.join(numbers)}{when}"
    elif earlier:
        reason = f"{where} {', '.join(earlier)} during the window, now {', '.join(numbers) or 'cleared'}{when}"
    elif temp is not None and max_op is not None and temp >= max_op:
        reason = f"{where} at {temp:.0f} C, at or above its max operating {max_op:.0f} C, no throttle reason set{when}"
    else:
        reason = (f"{where} shows no throttle reason within {cfg.recent_s:.0f} s of the window"
                  f"{', ' + ', '.join(numbers) if numbers else ''}: the slowdown is not visible in GPU telemetry "
                  f"(input pipeline, host CPU, software or network){when}")
    return [reason], {k: v for k, v in evidence.items() if math.isfinite(v)}
