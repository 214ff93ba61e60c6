"""Time per host sample of each telemetry-worker step, in one process (no Kafka, no faust): the stages' own share of
the worker's cost, beside bench/throughput.py's whole-worker figure (JSON out).

    python bench/stages.py [--hosts 1000] [--ticks 12] [--interval 1] [--repeat 3] [--baseline /tmp/before]

A simulated fleet's samples and NCCL steps are encoded, decoded by their topics' validators and fed, in batches of
--batch records, to every step of the telemetry worker through the runtime's StepState (its live tables lent as in
the worker), the way a lane would; state writes are kept in memory as a flush would, and each durable one is encoded
as its changelog record: `changelog <table>` is their number per host per simulated minute, `changelog bytes <table>`
their mean size (what a restarted worker restores, before compaction). --baseline DIR runs this same
script over another checkout (`git archive <commit> | tar -x -C DIR`; one whose stages are all StageSpecs, 4519ff4
or later), interleaved with this tree's runs.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

import orjson

from report import save  # bench/report.py, beside this script


def measure(hosts: int, ticks: int, batch: int, interval: float) -> dict[str, float]:
    """µs per host sample (with its NCCL steps): decode+check, then each step (its state writes included). CPU time of
    this process, not wall time: on a shared machine other tenants' load stretches wall time by up to 2x run to run."""
    from agents.simulator.simulate import FleetSimulator
    from schemas.codec import encode
    from schemas.topics import NCCL, SAMPLES, Topic
    from streams import registry
    from streams.runtime.spec import Record
    from streams.runtime.state import _DELETED, StepState
    from streams.settings import streams_settings

    gc.set_threshold(50_000, 20, 100)  # the worker's (FLEETPULSE_STREAMS_GC_YOUNG)
    sim = FleetSimulator(hosts, seed=7, start_ts=1_700_000_000.0, interval=interval, nccl_interval=1.0)
    raw = []
    for _ in range(ticks):
        tick = sim.step()
        raw += [(SAMPLES, s["host"], encode(s)) for s in tick.samples] + [(NCCL, n["host"], encode(n)) for n in tick.nccl]
    samples = sum(1 for topic, _, _ in raw if topic is SAMPLES)
    lends = "lend" in inspect.signature(StepState).parameters  # older trees copy live objects on every get
    settings, steps = streams_settings(None), []
    for stage in registry.select(None):
        if stage.worker != "telemetry":
            continue
        tables = {t.name: {} for t in stage.tables}
        live = {t.name: t.live for t in stage.tables if getattr(t, "live", None) is not None}
        for step in stage.steps:
            steps.append((f"{stage.name}.{step.run.__name__}", step, tables, live, stage.config(settings), {}))
    offsets: dict[tuple[str, int], int] = defaultdict(int)
    started, decoded = time.process_time(), []
    for topic, key, value in raw:
        partition = zlib.crc32(key.encode()) % topic.partitions
        decoded.append((topic, key, topic.decode(value), partition, offsets[topic.name, partition]))
        offsets[topic.name, partition] += 1
    cost = {"decode+check": time.process_time() - started}
    changelog: dict[str, list[int]] = defaultdict(list)  # table -> the size of each changelog record
    for lane in ("telemetry", "nccl"):
        mine = [s for s in steps if s[1].lane == lane]
        topics = {i.topic.name for s in mine for i in s[1].inputs if isinstance(i.topic, Topic)}
        records = [d for d in decoded if d[0].name in topics]
        for first in range(0, len(records), batch):
            chunk = records[first:first + batch]
            for name, step, tables, live, config, memo in mine:
                kinds = {i.topic.name: i.kind for i in step.inputs if isinstance(i.topic, Topic)}
                recs = [Record(kinds[t.name], v, k, t.name, p, o, 0) for t, k, v, p, o in chunk if t.name in kinds]
                if not recs:
                    continue
                t0 = time.process_time()
                kw = {"durable": {}, "lend": True} if lends else {}
                state = StepState(tables, {r.key: r.partition for r in recs}, memo=memo, live=live, **kw)
                step.run(recs, state, config)
                for (table, key), (value, durable, _) in state.writes.items():  # what flush keeps in memory
                    if value is _DELETED:
                        tables[table].pop(key, None)
                        continue
                    if durable:  # the changelog's copy
                        record = orjson.dumps(value.to_json() if table in live else value,
                                              option=orjson.OPT_NON_STR_KEYS)
                        changelog[f"{name.split('.')[0]}-{table}"].append(len(record))
                    tables[table][key] = value
                cost[name] = cost.get(name, 0.0) + time.process_time() - t0
    out = {name: round(1e6 * s / samples, 1) for name, s in cost.items()}
    out["total"] = round(sum(out.values()), 1)
    for table, sizes in sorted(changelog.items()):
        out[f"changelog {table}"] = round(len(sizes) / hosts / (ticks * interval / 60), 2)
        out[f"changelog bytes {table}"] = round(sum(sizes) / len(sizes))
    return out


def run_tree(tree: Path | None, args) -> dict[str, float]:
    """One measurement in a fresh process, over `tree` (None: this checkout)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--hosts", str(args.hosts), "--ticks",
           str(args.ticks), "--batch", str(args.batch), "--interval", str(args.interval)]
    done = subprocess.run(cmd, env=env, cwd=tree or Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--ticks", type=int, default=12)
    p.add_argument("--batch", type=int, default=500, help="records per step batch (the worker's streams_batch_max)")
    p.add_argument("--interval", type=float, default=1.0, help="simulated seconds between a host's samples (the "
                                                               "agent's default is 10)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", type=Path, help="another checkout, measured interleaved with this one")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("bench/results/stages.json"))
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.hosts, args.ticks, args.batch, args.interval)))
        return
    trees = {"after": None} if args.baseline is None else {"before": args.baseline.resolve(), "after": None}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for k in range(args.repeat):
        for name in (list(trees) if k % 2 == 0 else list(trees)[::-1]):
            runs[name].append(run_tree(trees[name], args))
            print(name, json.dumps(runs[name][-1]), file=sys.stderr)
    out: dict = {"data": {"hosts": args.hosts, "ticks": args.ticks, "interval": args.interval, "batch": args.batch,
                          "repeat": args.repeat,
                          "units": "µs per host sample (with its NCCL steps); changelog: records per host per "
                                   "simulated minute, and their mean bytes; medians"}}
    for name, rs in runs.items():
        out[name] = {key: round(statistics.median(r[key] for r in rs if key in r), 2) for key in rs[0]}
    if "before" in runs:
        out["after_vs_before"] = {key: round(out["after"][key] / out["before"][key], 2)
                                  for key in out["after"] if out["before"].get(key)}
    save(out, args.out)


if __name__ == "__main__":
    main()
