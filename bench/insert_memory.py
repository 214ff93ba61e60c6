"""What one of the sink's gpu_samples inserts costs the ClickHouse server in memory and time (its rollup views
included), with the tables as the schemas make them, beside the same tables with ClickHouse's default part format
(every part over 10 MB uncompressed written wide: a file and a write buffer per column stream).

One tick of a simulated fleet (a sample per host, 8 GPUs each) is one insert, through the sink's own JSON intake, on
the project's local server (started in a temporary data directory and stopped at the end). The two databases take
turns, tick by tick, so the machine's swings hit both; the server reports each insert's memory (its summary's
memory_usage, the peak the query's memory tracker saw) and time (elapsed_ns). Merges are held off meanwhile; then
each database's rollup_gpu_1m parts are merged into one (OPTIMIZE ... FINAL) while system.merges is read every 50 ms:
the merge's peak memory, which grows with the parts merged at once and their column streams, not with their rows,
and its time.

    .venv/bin/python bench/insert_memory.py [--hosts 5000] [--ticks 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.simulator.simulate import FleetSimulator  # noqa: E402
from core.clickhouse import connect  # noqa: E402
from core.settings import CommonSettings  # noqa: E402
from schemas.codec import encode  # noqa: E402
from schemas.ddl import WIDE_PART_BYTES  # noqa: E402
from schemas.json_intake import INTAKES  # noqa: E402
from schemas.rollups import ROLLUPS  # noqa: E402
from sinks import store  # noqa: E402

CLICKHOUSE_DEFAULT_WIDE_PART_BYTES = 10 << 20
FED = ["gpu_samples"] + [r.name for r in ROLLUPS.values() if r.source == "gpu_samples"]


def _database(name: str, wide_part_bytes: int):
    settings = CommonSettings(clickhouse_database=name)
    store.prepare(settings)
    client = connect(settings, "owner")
    if wide_part_bytes != WIDE_PART_BYTES:
        for table in FED:
            client.command(f"ALTER TABLE {table} MODIFY SETTING min_bytes_for_wide_part = {wide_part_bytes}")
    for table in FED:
        client.command(f"SYSTEM STOP MERGES {table}")
    return client


def _merge_peak_mb(client, watcher, table: str) -> tuple[float, int]:
    """`table`'s parts merged into one; the merge's peak memory (MB) as system.merges showed it, the parts, and the
    seconds it took."""
    peak, done, began = [0], threading.Event(), time.perf_counter()
    where = "database = currentDatabase() AND table = {t:String}"

    def watch() -> None:
        while not done.is_set():
            for (m,) in watcher.query(f"SELECT memory_usage FROM system.merges WHERE {where}",
                                      parameters={"t": table}).result_rows:
                peak[0] = max(peak[0], m)
            time.sleep(0.05)

    parts = client.query(f"SELECT count() FROM system.parts WHERE active AND {where}",
                         parameters={"t": table}).result_rows[0][0]
    thread = threading.Thread(target=watch)
    thread.start()
    try:
        client.command(f"SYSTEM START MERGES {table}")
        client.command(f"OPTIMIZE TABLE {table} FINAL")
    finally:
        done.set()
        thread.join()
    return peak[0] / 1e6, parts, time.perf_counter() - began


def _server(data: str, command: str) -> None:
    env = {**os.environ, "FLEETPULSE_DATA_DIR": data}
    subprocess.run([sys.executable, "-m", "fleetpulse.cli", "clickhouse", command], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=5000, help="simulated hosts, 8 GPUs each: one insert per tick")
    ap.add_argument("--ticks", type=int, default=6, help="inserts into each database")
    args = ap.parse_args()
    sim = FleetSimulator(args.hosts, seed=7, start_ts=1_800_000_000.0, nccl_interval=0)
    intake = INTAKES["gpu_samples"]
    ticks = [[intake.line(encode(rec), 0, k * args.hosts + i, int(rec["ts"] * 1000))
              for i, rec in enumerate(sim.step().samples)] for k in range(args.ticks)]
    data = tempfile.mkdtemp(prefix="bench-insert-memory-")
    os.environ["FLEETPULSE_DATA_DIR"] = data
    _server(data, "start")
    try:
        clients = {"schemas": _database("bench_schemas", WIDE_PART_BYTES),
                   "clickhouse default": _database("bench_default", CLICKHOUSE_DEFAULT_WIDE_PART_BYTES)}
        mb: dict[str, list[float]] = {k: [] for k in clients}
        seconds: dict[str, list[float]] = {k: [] for k in clients}
        for k, lines in enumerate(ticks):
            for name, client in clients.items():
                summary = store.insert_lines(client, "gpu_samples", intake, lines, f"tick-{k}", embedded=False)
                mb[name].append(int(summary["memory_usage"]) / 1e6)
                seconds[name].append(int(summary["elapsed_ns"]) / 1e9)
        parts = {name: client.query("SELECT table, groupUniqArray(part_type) FROM system.parts WHERE active AND "
                                    "database = currentDatabase() GROUP BY table").result_rows
                 for name, client in clients.items()}
        merges = {name: _merge_peak_mb(
            client, connect(CommonSettings(clickhouse_database=client.database), "owner"), "rollup_gpu_1m")
                  for name, client in clients.items()}
    finally:
        _server(data, "stop")
    now, default = (statistics.median(mb[k]) for k in clients)
    print(json.dumps({"hosts": args.hosts, "gpu_rows_per_insert": 8 * args.hosts, "ticks": args.ticks,
                      "wide_part_bytes": {"schemas": WIDE_PART_BYTES, "clickhouse default":
                                          CLICKHOUSE_DEFAULT_WIDE_PART_BYTES},
                      "insert_memory_mb_median": {"schemas": round(now), "clickhouse default": round(default),
                                                  "ratio": round(now / default, 2)},
                      "insert_memory_mb": {k: [round(v) for v in vs] for k, vs in mb.items()},
                      "insert_s_median": {k: round(statistics.median(vs), 3) for k, vs in seconds.items()},
                      "part_types": {k: {t: sorted(types) for t, types in v if t in FED} for k, v in parts.items()},
                      "rollup_gpu_1m_merge": {k: {"parts": n, "peak_mb": round(mb), "seconds": round(s, 2)}
                                              for k, (mb, n, s) in merges.items()}},
                     indent=2))


if __name__ == "__main__":
    main()
