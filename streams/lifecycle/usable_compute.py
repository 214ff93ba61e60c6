"""Usable compute: schedulable GPUs x performance factor / installed GPUs, and where the rest of the fleet went."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# A node's share, in GPUs: installed, usable, then the buckets that add up to the rest.
BUCKETS = ("drained", "validating", "replace", "gated", "lost", "straggler_loss", "throttled")
SHARE = ("installed", "usable", *BUCKETS)
OUT_OF_SERVICE = {"drain_requested": "drained", "drained": "drained", "repairing": "drained",
                  "validating": "validating", "replace": "replace"}


def node_share(state: str, inputs: Mapping[str, float], job_runs_on: bool = False) -> list[float]:
    """One node's GPUs by where they are: out of service by lifecycle state, gated by health, or in use at the
    performance factor its health inputs give (a flagged straggler counts s/(1+s) lost, throttling the rest).
    `job_runs_on`: a drain after the job was asked and the bot has not reported the node drained: it takes no new job,
    but the one it runs goes on, and its GPUs count as in use until then."""
    installed = float(inputs.get("installed_gpus", 0.0))
    row = dict.fromkeys(SHARE, 0.0)
    row["installed"] = installed
    if state in OUT_OF_SERVICE and not (job_runs_on and state == "drain_requested"):
        row[OUT_OF_SERVICE[state]] = installed
    elif inputs.get("gated", 0.0):
        row["gated"] = installed
    else:
        present = min(installed, float(inputs.get("present_gpus", installed)))
        straggler = min(present, float(inputs.get("straggler_loss_gpus", 0.0)))
        throttled = min(present - straggler, float(inputs.get("throttle_loss_gpus", 0.0)))
        row.update(lost=installed - present, straggler_loss=straggler, throttled=throttled,
                   usable=present - straggler - throttled)
    return [round(row[k], 4) for k in SHARE]


def changed(old: list[float] | None, new: list[float], tolerance: float = 0.05) -> bool:
    """Whether a node's share moved enough to tell the fleet (tolerance in GPUs)."""
    return old is None or len(old) != len(new) or any(abs(a - b) > tolerance for a, b in zip(old, new))


def fleet_usable(shares: Iterable[list[float]], minute_ts: float) -> dict:
    """The fleet's usable compute for one minute from every node's share (each a SHARE-ordered list)."""
    totals = dict.fromkeys(SHARE, 0.0)
    nodes = 0
    for share in shares:
        nodes += 1
        for k, v in zip(SHARE, share):
            totals[k] += v
    installed = totals["installed"]
    frac = (lambda v: round(v / installed, 6)) if installed else (lambda v: 0.0)  # noqa: E731
    schedulable = installed - sum(totals[k] for k in ("drained", "validating", "replace", "gated", "lost"))
    return {"scope": "fleet", "minute_ts": minute_ts, "nodes": nodes, "installed_gpus": round(installed, 3),
            "schedulable_gpus": round(schedulable, 3), "usable_gpus": round(totals["usable"], 3),
            "usable_compute": frac(totals["usable"]),
            "breakdown": {k: frac(totals[k]) for k in BUCKETS},
            "breakdown_gpus": {k: round(totals[k], 3) for k in BUCKETS}}


def minutes_due(last_minute: int | None, ts: float, max_minutes: int = 60,
                lateness_s: float = 0.0) -> tuple[list[int], int]:
    """Minutes (epoch // 60) an input at `ts` completes, lateness_s after their end, that were not reported yet (at
    most the last max_minutes), and the new last reported minute. The first input only starts the clock."""
    now = int((ts - lateness_s) // 60)
    if last_minute is None:
        return [], now - 1
    due = list(range(max(last_minute + 1, now - max_minutes), now))
    return due, max(last_minute, now - 1)


def known_nodes(keys: Iterable[str]) -> set[str]:
    """The nodes the fleet step's table has heard of: a reported share ("share:<host>") or one still pending
    ("pending:<host>")."""
    return {k.split(":", 1)[1] for k in keys if k.startswith(("share:", "pending:"))}


def add_change(changes: list[list], ts: float, share: list[float]) -> list[list]:
    """A node's share changes not yet folded into a reported minute, in event-time order. A node's own changes
    arrive in the order its state moved, so the newest holds from its time on and replaces any dated later (a drain
    is dated at its proposal, before health rows that came during the breaker's round trip); other nodes' later
    records never displace it: it still lands in its own minute."""
    return [*(c for c in changes if c[0] <= ts), [ts, share]]


def fold(changes: list[list], end: float) -> tuple[list[float] | None, list[list]]:
    """A node's share as at `end` from its pending changes (None: none before `end`), and the changes after it."""
    before = [c for c in changes if c[0] < end]
    return (before[-1][1] if before else None), changes[len(before):]
