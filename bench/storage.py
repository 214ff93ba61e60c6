"""Bytes on disk per GPU-sample in gpu_samples, per column, with every value read back and compared, and the speed of
a dashboard's two usual reads (JSON out).

    python bench/storage.py [--hosts 16] [--minutes 60] [--days 1] [--baseline /tmp/before]

A simulated fleet (seeded, 1 s samples as `fleetpulse up` sends them) is turned into rows by the tree's own sink
extraction (schemas.tables) and inserted, a tick per insert, into an embedded store created by the tree's own DDL,
with realistic provenance (6 partitions, a Kafka timestamp a few ms after the sample). After OPTIMIZE FINAL, the
sizes come from system.parts_columns (compressed data per column; marks and the primary index are in `on_disk`).
Every field of every reading is then read back by its name and compared with what the record carried.
For the reads, the hour is copied, shifted by an hour at a time, into a second table until it holds --days days
(copies repeat the hour, so they would flatter compression: sizes are measured on the hour alone):
one GPU's day as a per-minute series, and the whole fleet's last hour summed per GPU, each a median of --repeat.
--baseline DIR runs the same over another checkout (`git archive <commit> | tar -x -C DIR`), on the same records
(their digest is printed by both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from datetime import datetime
from pathlib import Path

from report import save  # bench/report.py, beside this script

PARTITIONS = 6
SEED = 7


def _records(hosts: int, minutes: int, start: float) -> tuple[list[dict], int]:
    from agents.simulator.simulate import FleetSimulator
    from schemas.codec import encode

    sim = FleetSimulator(hosts, seed=SEED, start_ts=start, nccl_interval=0)
    out, digest = [], 0
    for _ in range(minutes * 60):
        for s in sim.step().samples:
            digest = zlib.crc32(encode(s), digest)
            out.append(s)
    return out, digest


def _sizes(client, table: str) -> dict:
    rows = client.query(f"SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE table = '{table}' AND active"
                        ).result_rows[0]
    per = client.query("SELECT column, any(type), sum(column_data_compressed_bytes),"
                       " sum(column_data_uncompressed_bytes) FROM system.parts_columns"
                       f" WHERE table = '{table}' AND active GROUP BY column").result_rows
    n = rows[0]
    columns = {c: {"type": t, "bytes_per_row": round(b / n, 3), "ratio": round(u / b, 1) if b else None}
               for c, t, b, u in sorted(per, key=lambda r: -r[2])}
    return {"rows": n, "bytes_per_gpu_sample": round(sum(r[2] for r in per) / n, 2),
            "on_disk_per_gpu_sample": round(rows[1] / n, 2), "columns": columns}


def _same(got, sent) -> bool:
    if isinstance(got, datetime):
        return sent is not None and round(got.timestamp() * 1000) == round(sent * 1000)
    return got == sent


def _round_trip(client, table, records: list[dict]) -> dict:
    """Every field of every reading, read back by the name the record gave it (a renamed GPU field by its column's);
    a field the record left out is compared with its default."""
    def named(fields):
        return [(f, getattr(f.column, "read_as", f.column.name)) for f in fields]  # older trees: no aliases

    head, items = named(table.fields), named(table.item_fields)
    names = [name for _, name in head + items]
    sent = {(r["host"], r["seq"], g["index"]): (r, g) for r in records for g in r[table.items]}
    checked, wrong = 0, {}
    for row in client.query(f"SELECT {', '.join(names)} FROM {table.name}").result_rows:
        values = dict(zip(names, row))
        record, reading = sent.pop((values["host"], values["seq"], values["gpu_index"]))
        for source, fields in ((record, head), (reading, items)):
            for f, name in fields:
                checked += 1
                if not _same(values[name], source.get(f.key, f.default)):
                    wrong.setdefault(name, f"{values[name]!r} != {source.get(f.key, f.default)!r}")
    return {"values_compared": checked, "values_changed": wrong, "readings_missing": len(sent)}


def _timed(client, sql: str, params: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        client.query(sql, parameters=params)
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 1)


GPU_DAY = ("SELECT toStartOfMinute(ts) AS minute, avg(power_w), max(gpu_temp_c), avg(sm_active), avg(gpu_util_pct),"
           " max(energy_mj) - min(energy_mj) FROM {t:Identifier} WHERE cluster = {c:String} AND host = {h:String}"
           " AND gpu_index = {g:UInt8} AND ts >= {since:DateTime64(3)} GROUP BY minute ORDER BY minute")
FLEET_HOUR = ("SELECT host, gpu_index, avg(power_w), max(gpu_temp_c), avg(gpu_util_pct), avg(sm_active),"
              " max(ecc_dbe_volatile) FROM {t:Identifier}"
              " WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}"
              " GROUP BY host, gpu_index")


def measure(hosts: int, minutes: int, days: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fp-storage-") as store:
        return _measure(store, hosts, minutes, days, repeat)


def _measure(store: str, hosts: int, minutes: int, days: int, repeat: int) -> dict:
    import clickhouse_connect

    from schemas.ddl import ONE_SERVER, create_table
    from schemas.tables import TABLES

    table = TABLES["gpu_samples"]
    hour_s = minutes * 60
    start = float(int(time.time()) // 3600 * 3600 - days * 86400)  # within the table's TTL, whole hours
    records, digest = _records(hosts, minutes, start)
    client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
    client.command(f"CREATE DATABASE IF NOT EXISTS {ONE_SERVER.database}")  # create_table names its database
    client = clickhouse_connect.get_client(dsn=f"chdb://{store}", database=ONE_SERVER.database)
    # Wide parts at any size, so that system.parts_columns has a figure for every column.
    client.command(create_table(table) + ", min_bytes_for_wide_part = 0")
    jitter, offsets = random.Random(SEED), [0] * PARTITIONS
    t0 = time.perf_counter()
    by_ts: dict[float, list[tuple]] = {}
    for r in records:
        p = zlib.crc32(r["host"].encode()) % PARTITIONS
        kafka_ts = round(r["ts"] * 1000) + jitter.randint(1, 40)
        by_ts.setdefault(r["ts"], []).extend(table.rows(r, p, offsets[p], kafka_ts))
        offsets[p] += 1
    extract_s = time.perf_counter() - t0
    for rows in by_ts.values():
        client.insert(table.name, rows, column_names=table.column_names)
    client.command(f"OPTIMIZE TABLE {table.name} FINAL")
    out = {"records_digest": f"{digest:08x}", "samples": len(records), "extract_us_per_gpu_row":
           round(1e6 * extract_s / sum(map(len, by_ts.values())), 2), **_sizes(client, table.name)}
    out["round_trip"] = _round_trip(client, table, records)
    if not days:
        return out
    client.command(f"CREATE TABLE day AS {table.name}")
    physical = [r[0] for r in client.query("SELECT name FROM system.columns WHERE table = {t:String} AND "
                                           "default_kind != 'ALIAS' ORDER BY position", parameters={"t": table.name}
                                           ).result_rows]
    for k in range(days * 86400 // hour_s):
        shift = f"toIntervalSecond({k * hour_s})"
        shifted = {"ts": f"ts + {shift}", "kafka_ts": f"kafka_ts + {shift}", "seq": f"seq + {k * hour_s}"}
        client.command(f"INSERT INTO day ({', '.join(physical)}) SELECT "
                       f"{', '.join(shifted.get(c, c) for c in physical)} FROM {table.name}")
    client.command("OPTIMIZE TABLE day FINAL")
    end = start + days * 86400
    host = records[0]["host"]
    params = {"t": "day", "c": records[0]["cluster"], "h": host, "g": 3, "since": end - 86400,
              "until": end}
    out["day_rows"] = client.query("SELECT count() FROM day").result_rows[0][0]
    out["gpu_day_ms"] = _timed(client, GPU_DAY, params, repeat)
    out["fleet_hour_ms"] = _timed(client, FLEET_HOUR, {**params, "since": end - 3600}, repeat)
    return out


def run_tree(tree: Path | None, args) -> dict:
    """One measurement in a fresh process, over `tree` (None: this checkout)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--hosts", str(args.hosts), "--minutes",
           str(args.minutes), "--days", str(args.days), "--repeat", str(args.repeat)]
    done = subprocess.run(cmd, env=env, cwd=tree or Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench/storage.py over {tree or 'this tree'} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=16, help="simulated hosts (8 GPUs each)")
    p.add_argument("--minutes", type=int, default=60, help="simulated minutes whose bytes are measured")
    p.add_argument("--days", type=int, default=1, help="days the read-speed table holds (0: no reads timed)")
    p.add_argument("--repeat", type=int, default=7, help="runs per timed read")
    p.add_argument("--baseline", type=Path, help="another checkout, measured on the same records")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("bench/results/storage.json"))
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.hosts, args.minutes, args.days, args.repeat)))
        return
    trees = {"after": None} if args.baseline is None else {"before": args.baseline.resolve(), "after": None}
    out: dict = {"data": {"hosts": args.hosts, "gpus": 8 * args.hosts, "minutes": args.minutes, "interval_s": 1.0,
                          "days_for_reads": args.days, "repeat": args.repeat}}
    for name, tree in trees.items():
        out[name] = run_tree(tree, args)
        print(name, out[name]["bytes_per_gpu_sample"], "B/GPU-sample", file=sys.stderr)
    if "before" in out:
        b, a = out["before"], out["after"]
        if b["records_digest"] != a["records_digest"]:
            print("warning: the two trees' simulators made different records", file=sys.stderr)
        out["after_vs_before"] = {k: round(a[k] / b[k], 3) for k in
                                  ("bytes_per_gpu_sample", "on_disk_per_gpu_sample", "gpu_day_ms", "fleet_hour_ms")
                                  if k in a}
    save(out, args.out)


if __name__ == "__main__":
    main()
