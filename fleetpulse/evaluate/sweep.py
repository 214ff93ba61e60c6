"""Sweeps: one fault family over a grid of its parameters, through the real stage code offline, against truth.

    python -m fleetpulse.evaluate.sweep flaps [--periods 30,60,...] [--duties 0.25,0.5,0.9] [--hours 2]
    python -m fleetpulse.evaluate.sweep episodes [--durations 30,60,...]
    python -m fleetpulse.evaluate.sweep stragglers [--pcts 5,7,...] [--ranks 16,128,...] [--durations 30,60,...]
    python -m fleetpulse.evaluate.sweep outages
    python -m fleetpulse.evaluate.sweep crashes [--crashes 2,5,...] [--every 120,600,...]

Each cell simulates a small fleet with the fault on one GPU and runs every stage on it one record at a time, each
output delivered at once to the steps that read it (streams/runtime/offline.py: what a never-lagging worker decides;
the batch-invariance test holds the worker to the same decisions). No broker, no store, no bot: drain requests are
the decisions (first attempts; nobody answers them). A cell passes when the pipeline drained exactly when the
simulator's truth says it should (agents/simulator/truth.py) and paged at most `max_pages_per_hour`. Episodes: one
thermal runaway or power cap of each duration, which must page once at most, drain nothing, and alert exactly when
it outlasts its rule's dwell (a power cap: as soon as a sample sees the limit under the board's default).
Outages: a host down, a port's link down, slower or flapping, a NIC failed, each of several lengths, on one host of 8;
drained exactly when truth says so. Crashes: one job crashing again and again (the application, not the hardware),
each crash logging a teardown's Xid 13, 43 and 45 on its GPUs: no drain, no escalation, whatever the count and the
spacing. Stragglers: one slow rank per cell through the straggler scoring core (fleetpulse/evaluate/straggler_sweep.py).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import orjson

from agents.simulator.simulate import FleetSimulator
from agents.simulator.truth import POWER_LIMIT_REDUCED
from fleetpulse.evaluate import straggler_sweep
from schemas.codec import encode
from schemas.topics import AGENT, ALERTS, DRAIN, FAULTS, HOST_EVENTS, NET, SAMPLES, XID
from streams import registry
from streams.runtime.offline import delivery_order, offline_steps
from streams.settings import streams_settings

T0 = 1_700_000_000.0
PERIODS = (30.0, 60.0, 180.0, 300.0, 600.0, 1200.0, 2400.0, 3600.0)
DUTIES = (0.1, 0.25, 0.5, 0.75, 0.9)
EPISODE_DURATIONS = (30.0, 60.0, 120.0, 240.0, 300.0, 360.0, 600.0)
OUTAGE_DURATIONS = (30.0, 60.0, 120.0, 180.0, 300.0, 900.0, None)
CRASHES, CRASH_EVERY_S = (2, 5, 8, 20), (120.0, 600.0, 1800.0, 3600.0)


@dataclass(frozen=True)
class Cell:
    """One grid cell's outcome: drain requests (time into the run, reason), pages, and what truth expects: "drain",
    "alert" (no drain), or "either" (a band where timing decides: not judged)."""

    params: dict
    drains: list[tuple[float, str]]
    pages: int
    hours: float
    truth: str
    alerts: tuple[str, ...] = ()  # the conditions that fired (not the incidents), by name
    most_firings: int = 0  # the most times one condition fired
    elsewhere: int = 0  # drains of hosts the fault was not on
    escalated: int = 0  # faults a history rule escalated (escalation_*)
    codes: tuple[str, ...] = ()  # the codes of the faults published

    @property
    def pages_per_hour(self) -> float:
        return self.pages / self.hours

    def ok(self, max_pages_per_hour: float) -> bool:
        if self.elsewhere or (self.escalated and self.truth != "drain"):
            return False
        if self.truth.startswith(("alert once", "nothing")):  # an episode: judged by what it raised
            raised = ("nothing" if not self.alerts else "alert once" if self.most_firings == 1 else
                      f"a condition {self.most_firings} times")
            return raised in self.truth.split(" or ") and not self.drains and self.pages <= 1
        drained = "drain" if self.drains else "alert"
        return self.truth in (drained, "either") and len(self.drains) <= 1 and self.pages_per_hour <= max_pages_per_hour


def run_cell(fault: dict, *, hours: float, hosts: int = 2, interval_s: float = 10.0, seed: int = 1,
             outcome: str | Callable[[list[dict]], str] | None = None, more: Sequence[dict] = (),
             jobs: list[int] | None = None) -> Cell:
    """`fault` (a scenario fault; `more` with it) on a fleet of `hosts` (`jobs`: the scenario's job layout) for
    `hours`, through every stage, judged by truth's tokens: a drain expected, allowed (a band where timing decides:
    "either") or neither; `outcome`: what the cell must show instead where the family says it (an episode's alert; a
    function of the truth records where truth decides)."""
    scenario = {"name": "sweep", "fleet": {"hosts": hosts, **({"jobs": jobs} if jobs else {})},
                "faults": [fault, *more]}
    sim = FleetSimulator(seed=seed, scenario=scenario, start_ts=T0, interval=interval_s, nccl_interval=0)
    truth: list[dict] = []

    def inputs() -> Iterator:
        for _ in range(round(hours * 3600 / interval_s)):
            tick = sim.step()
            truth.extend(tick.truth)
            for topic, records in ((AGENT, tick.agent), (SAMPLES, tick.samples), (XID, tick.xid), (NET, tick.net),
                                   (HOST_EVENTS, tick.host_events)):
                for value in records:
                    yield topic, value["host"], topic.decode(encode(value))

    _, made = delivery_order(offline_steps(registry.select(None), streams_settings(None)), inputs())
    emits = [e for out in made.values() for e in out]
    drains = [d for d in (orjson.loads(e.value) for e in emits if e.to is DRAIN)
              if d["action"] == "drain" and "resend_of" not in d["evidence"]]
    firing = [a for a in (orjson.loads(e.value) for e in emits if e.to is ALERTS) if a["status"] == "firing"]
    pages = [a for a in firing if not (a.get("labels") or {}).get("incident")]
    fired = Counter(a["alertname"] for a in firing if (a.get("labels") or {}).get("incident"))
    conditions = tuple(sorted(fired))
    faults = [orjson.loads(e.value) for e in emits if e.to is FAULTS]
    escalated = sum(1 for f in faults if f["rule"].startswith("escalation"))
    params = {k: v for k, v in fault.items() if k not in ("host", "gpu")}
    if callable(outcome):
        outcome = outcome(truth)
    expected = outcome or ("drain" if any("drain" in t["expected"] for t in truth) else
                           "either" if any("drain" in t["allowed"] for t in truth) else "alert")
    target = sim.fleet.hosts[fault["host"]] if isinstance(fault.get("host"), int) else fault.get("host")
    return Cell(params, [(d["ts"] - T0, d["reason"]) for d in drains], len(pages), hours, expected, conditions,
                max(fired.values(), default=0), sum(d["host"] != target for d in drains), escalated,
                tuple(sorted({f["code"] for f in faults})))


def flap(period_s: float, duty: float) -> dict:
    """A temperature reading flapping between 84 C and 90 C (past the 87 C max operating and 89 C slowdown limits:
    the GPU throttles while it reads high)."""
    return {"kind": "sensor_flap", "at": 0, "host": 0, "gpu": 2, "low_c": 84, "high_c": 90, "period_s": period_s,
            "duty": duty}


def flaps(periods=PERIODS, duties=DUTIES, hours: float = 2.0, interval_s: float = 10.0) -> list[Cell]:
    return [run_cell(f, hours=hours, interval_s=interval_s)
            for f in (flap(p, d) for p in periods for d in duties)]


def episode(kind: str, duration_s: float) -> dict:
    """One thermal runaway (to 91 C in 15 s) or one power cap at 400 W, 60 s into the run."""
    extra = {"peak_c": 91, "ramp_s": 15} if kind == "thermal_runaway" else {"cap_w": 400}
    return {"kind": kind, "at": 60, "duration": duration_s, "host": 0, "gpu": 3, **extra}


def episode_outcome(kind: str, duration_s: float, interval_s: float) -> str | Callable[[list[dict]], str]:
    """A runaway alerts once when two samples see it past the 89 C slowdown limit (GpuTempSlowdown's 15 s dwell; the
    15 s ramp and 10 s samples make that 35 s or more, give or take a sample); shorter is transient by design: it
    raises nothing. A power cap: what truth says (power_cap_outcome)."""
    if kind == "power_cap":
        return power_cap_outcome
    if abs(duration_s - 35.0) <= interval_s:
        return "alert once or nothing"
    return "alert once" if duration_s > 35.0 else "nothing"


def power_cap_outcome(truth: list[dict]) -> str:
    """A power cap alerts once when truth expects GpuPowerLimitReduced (a sample sees the enforced limit under the
    board's default; no dwell; GpuSwPowerCap joins it inside the same incident after 300 s), may when truth allows it
    (a cap shorter than a sample), else raises nothing."""
    if any(POWER_LIMIT_REDUCED in t["expected"] for t in truth):
        return "alert once"
    return "alert once or nothing" if any(POWER_LIMIT_REDUCED in t["allowed"] for t in truth) else "nothing"


def episodes(durations=EPISODE_DURATIONS, interval_s: float = 10.0) -> list[Cell]:
    return [run_cell(episode(kind, d), hours=(d + 600) / 3600, interval_s=interval_s,
                     outcome=episode_outcome(kind, d, interval_s))
            for kind in ("thermal_runaway", "power_cap") for d in durations]


def outage_faults(durations=OUTAGE_DURATIONS, flaps=(1, 2, 3, 5), every=(30.0, 300.0, 1500.0)) -> list[dict]:
    """A host that stops reporting, a port whose link goes down, runs slower or flaps, a NIC that fails: each of
    every length, 60 s into the run (durations None: until the run ends)."""
    out = []
    for d in durations:
        extra = {} if d is None else {"duration": d}
        out += [{"kind": "host_down", "at": 60, "host": 0, **extra},
                *({"kind": k, "at": 60, "host": 0, "port": 1, **extra} for k in ("link_down", "link_degraded",
                                                                                   "nic_down"))]
    out += [{"kind": "link_flap", "at": 60, "host": 0, "port": 1, "flaps": n, "every": e} for n in flaps for e in every]
    return out


def outages(faults: list[dict] | None = None, hours: float = 1.0, hosts: int = 8) -> list[Cell]:
    """Each outage on one host of `hosts` (enough that one silent host is the host's fault, not its rack's), for an
    hour: that host drained exactly when truth says so, at most once, and no other."""
    return [run_cell(f, hours=hours, hosts=hosts) for f in (faults or outage_faults())]


def crash_loop(crashes: int, every_s: float, first_s: float = 600.0) -> list[dict]:
    """job-0000 (hosts 0-3, 32 ranks) crashing `crashes` times `every_s` apart from `first_s`: each crash logs what a
    teardown logs, Xid 13 (the faulting kernel) on one GPU, Xid 43 (the channel reset as the process dies) and Xid 45
    (preemptive cleanup) on every GPU it ran on."""
    faults = []
    for k in range(crashes):
        at = first_s + k * every_s
        faults.append({"kind": "xid", "at": at, "host": 1, "gpu": 2, "code": 13, "hardware": False})
        faults += [{"kind": "xid", "at": at + 1 + n, "host": host, "gpu": gpu, "code": code, "hardware": False}
                   for host in range(4) for gpu in range(8) for n, code in enumerate((43, 45))]
    return faults


def crash_loops(crashes=CRASHES, every=CRASH_EVERY_S, interval_s: float = 60.0) -> list[Cell]:
    """A job crashing `crashes` times, `every` seconds apart, on 8 hosts, with every rule on: truth drains nothing."""
    cells = []
    for n in crashes:
        for e in every:
            first, *rest = crash_loop(n, e)
            cell = run_cell(first, more=rest, hours=(600 + n * e + 1200) / 3600, hosts=8, jobs=[4],
                            interval_s=interval_s, seed=n)
            cells.append(replace(cell, params={"crashes": n, "every_s": e}))
    return cells


def crash_table(cells: list[Cell]) -> str:
    lines = ["| crashes | every s | truth | drains | escalations | pages | ok |", "|---:|---:|---|---:|---:|---:|---|"]
    for c in cells:
        lines.append(f"| {c.params['crashes']} | {c.params['every_s']:g} | {c.truth} | {len(c.drains)} | "
                     f"{c.escalated} | {c.pages} | {'yes' if c.ok(0) else 'NO'} |")
    return "\n".join(lines)


def cells_table(cells: list[Cell], max_pages_per_hour: float) -> str:
    lines = ["| fault | truth | drained at s | reason | pages | ok |", "|---|---|---|---|---:|---|"]
    for c in cells:
        what = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in c.params.items()
                         if k not in ("at", "job"))
        at = ", ".join(f"{t:.0f}" for t, _ in c.drains) or "-"
        why = c.drains[0][1][:70] if c.drains else ""
        lines.append(f"| {what} | {c.truth} | {at} | {why} | {c.pages} | "
                     f"{'yes' if c.ok(max_pages_per_hour) else 'NO'} |")
    return "\n".join(lines)


def episode_table(cells: list[Cell]) -> str:
    lines = ["| kind | duration s | truth | conditions fired | pages | drains | ok |",
             "|---|---:|---|---|---:|---:|---|"]
    for c in cells:
        lines.append(f"| {c.params['kind']} | {c.params['duration']:g} | {c.truth} | {', '.join(c.alerts) or '-'} | "
                     f"{c.pages} | {len(c.drains)} | {'yes' if c.ok(0) else 'NO'} |")
    return "\n".join(lines)


def table(cells: list[Cell], max_pages_per_hour: float) -> str:
    lines = ["| period s | duty | high spell s | truth | drained at s | reason | pages/h | ok |",
             "|---:|---:|---:|---|---|---|---:|---|"]
    for c in cells:
        p, d = c.params["period_s"], c.params["duty"]
        at = ", ".join(f"{t:.0f}" for t, _ in c.drains) or "-"
        why = c.drains[0][1][:70] if c.drains else ""
        lines.append(f"| {p:g} | {d:g} | {p * d:g} | {c.truth} | {at} | {why} | "
                     f"{c.pages_per_hour:.1f} | {'yes' if c.ok(max_pages_per_hour) else 'NO'} |")
    return "\n".join(lines)


def _numbers(kind: type) -> Callable[[str], list]:
    """An argparse type: comma-separated numbers of `kind` ('2,5,8'); a bad list is one usage error naming it."""
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__} numbers "
                                             f"(e.g. 2,5,8)") from None
    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=("flaps", "episodes", "stragglers", "outages", "crashes"))
    ints, floats = _numbers(int), _numbers(float)
    p.add_argument("--crashes", type=ints, default=list(CRASHES), help="crashes: crashes of the job each")
    p.add_argument("--every", type=floats, default=list(CRASH_EVERY_S), help="crashes: seconds apart")
    p.add_argument("--durations", type=floats, default=None, help="episodes, stragglers: seconds each")
    p.add_argument("--pcts", type=floats, default=list(straggler_sweep.PCTS), help="stragglers: slowdowns")
    p.add_argument("--ranks", type=ints, default=list(straggler_sweep.RANKS), help="stragglers: job sizes")
    p.add_argument("--seeds", type=int, default=1, help="stragglers: seeds per persistent cell")
    p.add_argument("--periods", type=floats, default=list(PERIODS))
    p.add_argument("--duties", type=floats, default=list(DUTIES))
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--max-pages-per-hour", type=float, default=4.0)
    args = p.parse_args(argv)
    if args.family == "stragglers":
        cells = (straggler_sweep.persistent(args.pcts, args.ranks, args.seeds)
                 + straggler_sweep.episodes(args.durations or straggler_sweep.DURATIONS))
        print(straggler_sweep.table(cells))
        return 0 if all(c.ok() for c in cells) else 1
    if args.family == "crashes":
        cells = crash_loops(args.crashes, args.every)
        print(crash_table(cells))
        return 0 if all(c.ok(0) for c in cells) else 1
    if args.family == "outages":
        cells = outages()
        print(cells_table(cells, args.max_pages_per_hour))
        return 0 if all(c.ok(args.max_pages_per_hour) for c in cells) else 1
    if args.family == "episodes":
        cells = episodes(args.durations or EPISODE_DURATIONS)
        print(episode_table(cells))
        return 0 if all(c.ok(0) for c in cells) else 1
    cells = flaps(args.periods, args.duties, args.hours)
    print(table(cells, args.max_pages_per_hour))
    return 0 if all(c.ok(args.max_pages_per_hour) for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
