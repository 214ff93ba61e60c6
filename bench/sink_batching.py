"""What the sink's wait to fill a batch of a periodic stream costs the ClickHouse server in CPU, at a fleet's real rate.

A simulated fleet (`fleetpulse simulate --scenario fleet-scale`, real time: a sample from every host every 10 s, host i
at moment i mod 10 of the interval, NCCL timings, ports, agent status) is stored by `fleetpulse sink` on the project's
local server, once per wait (FLEETPULSE_SINK_PERIODIC_BATCH_MAX_SECONDS), each run under a topic prefix and database of
its own; the waits take turns round by round, so the machine's swings hit each. After a warm-up, the server's and the
sink's CPU are read from /proc over a window; at the end each run's rows are counted against what the simulator sent.
The broker and server are started in a data directory of their own and stopped at the end. No stream worker runs: the
sink reads the telemetry topics the simulator writes.

    .venv/bin/python bench/sink_batching.py [--hosts 5000] [--waits 1 5 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fleet_scale import CLI, REPO, ports, usage


def server_pid(data: Path) -> int:
    return json.loads((data / "clickhouse" / "server.pid").read_text())["pid"]


def one_run(args, env: dict[str, str], data: Path, name: str, wait: float) -> dict:
    env = {**env, "FLEETPULSE_TOPIC_PREFIX": f"{name}.", "FLEETPULSE_CLICKHOUSE_DATABASE": name,
           "FLEETPULSE_SINK_GROUP_ID": name, "FLEETPULSE_SINK_HTTP": "false",
           "FLEETPULSE_SINK_PERIODIC_BATCH_MAX_SECONDS": str(wait)}
    seconds = args.warmup + args.window + 15
    sim = subprocess.Popen([*CLI, "simulate", "--hosts", str(args.hosts), "--duration", str(seconds), "--speed", "1",
                            "--scenario", "fleet-scale"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
    sink = subprocess.Popen([*CLI, "sink"], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(args.warmup)
        store, began = server_pid(data), time.monotonic()
        before = {"server": usage(store), "sink": usage(sink.pid)}
        time.sleep(args.window)
        span = time.monotonic() - began
        cores = {k: round((usage(p)[0] - before[k][0]) / span, 3) for k, p in (("server", store), ("sink", sink.pid))}
        sent = json.loads(sim.communicate(timeout=seconds + 300)[0])
        stored, deadline = None, time.monotonic() + 300
        while stored != sent["gpu_readings"] and time.monotonic() < deadline:
            time.sleep(2)
            got = subprocess.run([*CLI, "query", "SELECT count() FROM gpu_samples"], env=env, capture_output=True,
                                 text=True, timeout=60)
            stored = int(got.stdout.strip() or 0) if got.returncode == 0 else None
    finally:
        for proc in (sim, sink):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
    return {"wait_s": wait, "server_cores": cores["server"], "sink_cores": cores["sink"],
            "gpu_rows_sent": sent["gpu_readings"], "gpu_rows_stored": stored}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=5000)
    p.add_argument("--waits", type=float, nargs="+", default=[1.0, 5.0, 10.0], help="seconds, one run each per round")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=float, default=50.0, help="seconds before the window (start, first batches)")
    p.add_argument("--window", type=float, default=120.0, help="seconds of CPU measured")
    p.add_argument("--port", type=int, default=13092, help="first of the run's ports (broker; the rest above it)")
    p.add_argument("--data", type=Path, default=Path("/tmp/fleetpulse-sink-batching"))
    p.add_argument("--out", type=Path, default=Path("bench/results/sink_batching.json"))
    args = p.parse_args()
    data = args.data.resolve()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "KAFKA_", "CLICKHOUSE"))},
           **ports(args.port), "FLEETPULSE_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
    shutil.rmtree(data, ignore_errors=True)
    runs = []
    try:
        for service in ("kafka", "clickhouse"):
            subprocess.run([*CLI, service, "start"], env=env, check=True, capture_output=True, timeout=300)
        for r in range(args.rounds):
            for wait in (args.waits if r % 2 == 0 else args.waits[::-1]):
                runs.append({"round": r, **one_run(args, env, data, f"sb{r}_{str(wait).replace('.', '_')}", wait)})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        for service in ("kafka", "clickhouse"):
            subprocess.run([*CLI, service, "stop"], env=env, capture_output=True, timeout=300)
    base = statistics.median(r["server_cores"] for r in runs if r["wait_s"] == args.waits[0])
    out = {"hosts": args.hosts, "window_s": args.window, "runs": runs, "by_wait": {
        str(w): {"server_cores_median": (m := statistics.median(r["server_cores"] for r in runs if r["wait_s"] == w)),
                 "server_vs_first": round(m / base, 2),
                 "sink_cores_median": statistics.median(r["sink_cores"] for r in runs if r["wait_s"] == w),
                 "sent_equals_stored": all(r["gpu_rows_sent"] == r["gpu_rows_stored"] for r in runs
                                           if r["wait_s"] == w)}
        for w in args.waits}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["by_wait"], indent=1))


if __name__ == "__main__":
    main()
