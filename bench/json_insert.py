"""The sink's two ways of storing samples, engine side only: Python extracting each GPU row (Table.rows) and
clickhouse-connect inserting them, against the engine extracting them from the records' own JSON lines
(schemas/json_intake.py: one INSERT ... SELECT ... ARRAY JOIN computing every stored column as Table.rows does).
Same store, rollups on, same records, alternated; then both ways' stored rows are compared value by value.

    .venv/bin/python bench/json_insert.py [--hosts 200] [--ticks 30] [--batch 6000] [--repeat 3] [--out F]

Engine side only: the Kafka fetch and the per-record check that decides dead letters are not in either figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.simulator.simulate import FleetSimulator  # noqa: E402
from core.settings import CommonSettings  # noqa: E402
from schemas.json_intake import INTAKES  # noqa: E402
from schemas.tables import TABLES  # noqa: E402
from core.clickhouse import connect  # noqa: E402
from sinks import store  # noqa: E402

from report import save  # noqa: E402  (bench/report.py, beside this script)

TABLE = TABLES["gpu_samples"]
INTAKE = INTAKES["gpu_samples"]
KAFKA_TS_MS = 1_800_000_000_000


def python_path(client, raws: list[bytes], batch: int) -> None:
    for i in range(0, len(raws), batch):
        rows = [row for off, raw in enumerate(raws[i:i + batch], i)
                for row in TABLE.rows(orjson.loads(raw), 0, off, KAFKA_TS_MS)]
        store.insert(client, "gpu_samples", TABLE.column_names, rows, uuid.uuid4().hex)


def json_path(client, raws: list[bytes], batch: int) -> None:
    for i in range(0, len(raws), batch):  # each record's provenance spliced in front of its own fields
        lines = [INTAKE.line(raw, 0, off, KAFKA_TS_MS) for off, raw in enumerate(raws[i:i + batch], i)]
        store.insert_lines(client, "gpu_samples", INTAKE, lines, uuid.uuid4().hex, embedded=True)


def main(args) -> dict:
    database = "json_insert"
    settings = CommonSettings(clickhouse_url=f"chdb://{tempfile.mkdtemp(prefix='fleetpulse-json-')}",
                              clickhouse_database=database)
    store.prepare(settings)
    client = connect(settings, "owner")
    sim = FleetSimulator(args.hosts, seed=1, start_ts=1_800_000_000.0, nccl_interval=0)
    raws = [orjson.dumps(s) for _ in range(args.ticks) for s in sim.step().samples]
    rows = sum(len(orjson.loads(r)["gpus"]) for r in raws)
    paths = {"python_rows": python_path, "engine_json": json_path}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeat):
        for name, fn in paths.items():
            client.command("TRUNCATE TABLE gpu_samples")
            t0 = time.perf_counter()
            fn(client, raws, args.batch)
            rates[name].append(rows / (time.perf_counter() - t0))
    stored = {}
    for name, fn in paths.items():
        client.command("TRUNCATE TABLE gpu_samples")
        fn(client, raws, args.batch)
        stored[name] = client.query("SELECT * EXCEPT (ingested_at) FROM gpu_samples "
                                    "ORDER BY kafka_offset, gpu_index").result_rows
    a, b = stored["python_rows"], stored["engine_json"]
    differing = sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
    med = {name: round(statistics.median(r)) for name, r in rates.items()}
    return {"data": {"hosts": args.hosts, "ticks": args.ticks, "samples": len(raws), "gpu_rows": rows,
                     "mean_sample_bytes": sum(map(len, raws)) // len(raws), "batch_records": args.batch},
            "rows_per_s_median": med, "rows_per_s_all": {n: [round(v) for v in r] for n, r in rates.items()},
            "engine_json_vs_python_rows": round(med["engine_json"] / med["python_rows"], 2),
            "ratio_per_round_median": round(statistics.median(
                j / p for j, p in zip(rates["engine_json"], rates["python_rows"])), 2),
            "stored_rows": {"python_rows": len(a), "engine_json": len(b), "differing": differing}}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=200)
    p.add_argument("--ticks", type=int, default=30)
    p.add_argument("--batch", type=int, default=6000, help="records per insert")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    save(main(args), args.out)
