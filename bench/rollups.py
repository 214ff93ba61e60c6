"""What the rollups cost the sink's inserts: each rollup view's query over simulated gpu_samples rows (µs per row,
one thread), and inserts into gpu_samples with and without the views, alternated (median rows/s).

    .venv/bin/python bench/rollups.py [--hosts 16] [--seconds 600] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.simulator.simulate import FleetSimulator  # noqa: E402
from core.settings import CommonSettings  # noqa: E402
from schemas.rollups import ROLLUPS  # noqa: E402
from schemas.tables import TABLES  # noqa: E402
from core.clickhouse import connect  # noqa: E402
from sinks import store  # noqa: E402

TABLE = TABLES["gpu_samples"]
BATCH = 50_000


def _rows(hosts: int, seconds: int) -> list[tuple]:
    sim = FleetSimulator(hosts, seed=7, start_ts=1_800_000_000.0, nccl_interval=0)
    records = [s for _ in range(seconds) for s in sim.step().samples]
    return [row for off, rec in enumerate(records) for row in TABLE.rows(rec, 0, off, int(rec["ts"] * 1000))]


def _database(path: str, name: str, views: bool):
    cfg = CommonSettings(clickhouse_url=f"chdb://{path}", clickhouse_database=name)
    store.prepare(cfg)
    client = connect(cfg, "owner")
    if not views:
        for rollup in ROLLUPS.values():
            for view in rollup.view_names():
                client.command(f"DROP VIEW {view}")
    return client


def _insert(client, rows: list[tuple], tag: str) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(rows), BATCH):
        store.insert(client, "gpu_samples", TABLE.column_names, rows[i:i + BATCH], f"{tag}:{i}")
    return len(rows) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = _rows(args.hosts, args.seconds)
    path = tempfile.mkdtemp(prefix="bench-rollups-")
    plain = _database(path, "bench_plain", views=False)
    _insert(plain, rows, "plain")
    per_query = {}
    for rollup in ROLLUPS.values():
        if rollup.source != "gpu_samples":
            continue
        for view, sql in zip(rollup.view_names(), rollup.aggregates("bench_plain")):
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                plain.raw_query(f"{sql} SETTINGS max_threads = 1 FORMAT Null")
                times.append(time.perf_counter() - t0)
            per_query[view] = round(statistics.median(times) * 1e6 / len(rows), 2)
    rates: dict[str, list[float]] = {"without views": [], "with views": []}
    for k in range(args.repeat):  # alternated, each into a fresh database, so the machine's swings hit both
        for views in (False, True):
            client = _database(path, f"bench_{k}_{int(views)}", views=views)
            rates["with views" if views else "without views"].append(_insert(client, rows, f"r{k}"))
    with_views, without = (statistics.median(rates[k]) for k in ("with views", "without views"))
    print(json.dumps({"rows": len(rows), "query_us_per_row": per_query,
                      "insert_rows_per_s": {"without views": round(without), "with views": round(with_views),
                                            "ratio": round(with_views / without, 2)},
                      "runs": {k: [round(r) for r in v] for k, v in rates.items()}}, indent=2))


if __name__ == "__main__":
    main()
