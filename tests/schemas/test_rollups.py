"""The rollups on the real engine: every per-minute figure equals the same figure worked out in Python from the
records, a counter's rise across inserts and minute boundaries included, and a replayed batch changes nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from core.settings import CommonSettings
from schemas.rollup_views import VIEWS
from schemas.rollups import ROLLUPS, THROTTLING
from schemas.tables import TABLES
from sinks import store

START = 1_800_000_030.0  # half a minute past a minute: batches and minutes do not line up
STEPS, BATCH = 200, 37
GPU_TABLE = TABLES["gpu_samples"]


def records() -> list[dict]:
    """Four simulated hosts for 200 s; one GPU's volatile SBE count rises every 7 s and is reset at step 130 (a driver
    reload), another's throttle reasons flip on for a while."""
    from agents.simulator.simulate import FleetSimulator

    sim = FleetSimulator(4, seed=3, start_ts=START, nccl_interval=0)
    out = []
    for step in range(STEPS):
        for sample in sim.step().samples:
            for gpu in sample["gpus"]:
                if sample["host"].endswith("0") and gpu["index"] == 0:
                    gpu["ecc_sbe_volatile"] = (step if step < 130 else step - 130) // 7
                if sample["host"].endswith("1") and gpu["index"] == 2 and 40 <= step < 95:
                    gpu["throttle_reasons"] = 0x4 | 0x1
            out.append(sample)
    return out


def batches(recs: list[dict]) -> list[tuple[list[tuple], str]]:
    """The sink's rows and deduplication token per batch of 37 records."""
    out = []
    for start in range(0, len(recs), BATCH):
        rows = [row for off, rec in enumerate(recs[start:start + BATCH], start)
                for row in GPU_TABLE.rows(rec, partition=0, offset=off, kafka_ts_ms=int(rec["ts"] * 1000) + 5)]
        out.append((rows, f"samples|0:{start}-{start + BATCH - 1}"))
    return out


def expected(recs: list[dict]) -> dict[tuple, dict]:
    """Per (host, GPU, minute): sample count, mean and max temperature, max power, throttled samples, and the rises of
    energy and the SBE count: each reading's step from the one before, a drop read as a reset (a rise from zero)."""
    out: dict[tuple, dict] = {}
    last: dict[tuple, dict] = {}
    for rec in recs:
        minute = int(rec["ts"] // 60 * 60)
        for gpu in rec["gpus"]:
            key, before = (rec["host"], gpu["index"], minute), last.get((rec["host"], gpu["index"]), gpu)
            row = out.setdefault(key, {"samples": 0, "temps": [], "power_w_max": 0.0, "throttled_samples": 0,
                                       "energy_j": 0.0, "ecc_sbe_volatile_delta": 0})
            row["samples"] += 1
            row["temps"].append(gpu["gpu_temp_c"])
            row["power_w_max"] = max(row["power_w_max"], gpu["power_w"])
            row["throttled_samples"] += bool(gpu["throttle_reasons"] & THROTTLING)
            for counter, name, div in (("energy_mj", "energy_j", 1000), ("ecc_sbe_volatile", "ecc_sbe_volatile_delta", 1)):
                now, was = gpu[counter], before[counter]
                row[name] += (now - was if now >= was else now) / div
            last[(rec["host"], gpu["index"])] = gpu
    for row in out.values():
        temps = row.pop("temps")
        row["gpu_temp_c_avg"], row["gpu_temp_c_max"] = sum(temps) / len(temps), max(temps)
    return out


def insert_all(db, parts):
    for rows, token in parts:
        store.insert(db, "gpu_samples", GPU_TABLE.column_names, rows, token)


def snapshot(db) -> dict[str, object]:
    """Every view's rows (floats to 12 digits: a mean's last bit depends on the order its parts are summed) and every
    raw and rollup table's parts: a replay that added any row would add a part."""
    def rounded(rows):
        return [tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in row) for row in rows]

    out: dict[str, object] = {name: rounded(db.query(f"SELECT * FROM {name} ORDER BY ALL").result_rows)
                              for name in VIEWS}
    parts = db.query("SELECT table, name, rows FROM system.parts WHERE database = currentDatabase() AND active "
                     "ORDER BY table, name").result_rows
    out["parts"] = [p for p in parts if p[0] in TABLES or p[0] in ROLLUPS]
    return out


def test_every_gpu_minute_equals_the_figures_worked_out_from_the_records(db):
    recs = records()
    insert_all(db, batches(recs))
    got = {(h, i, int(m.replace(tzinfo=timezone.utc).timestamp())): dict(zip(cols, vals))
           for h, i, m, *vals in db.query(
               "SELECT host, gpu_index, minute, samples, gpu_temp_c_avg, gpu_temp_c_max, power_w_max, "
               "throttled_samples, energy_j, ecc_sbe_volatile_delta FROM gpu_1m").result_rows
           for cols in [("samples", "gpu_temp_c_avg", "gpu_temp_c_max", "power_w_max", "throttled_samples",
                         "energy_j", "ecc_sbe_volatile_delta")]}
    want = expected(recs)
    assert set(got) == set(want) and len(want) == 4 * 8 * 4  # 32 GPUs over 4 calendar minutes
    for key, row in want.items():
        assert got[key] == pytest.approx(row, rel=1e-9), key
    # the reset GPU rose 18 times before step 130 and 9 after it; nothing counted twice or lost across minutes
    sbe = db.query("SELECT sum(ecc_sbe_volatile_delta) FROM gpu_1m WHERE gpu_index = 0 AND host LIKE '%0'").result_rows
    assert sbe == [(129 // 7 + 69 // 7,)]


def test_node_rack_and_fleet_views_add_up_to_the_gpus(db):
    recs = records()
    insert_all(db, batches(recs))
    readings = len(recs) * 8
    assert db.query("SELECT sum(samples), sum(gpus) FROM node_1m").result_rows == [(readings, 4 * 8 * 4)]
    node = db.query("SELECT sum(power_w), sum(energy_j) FROM node_1m").result_rows[0]
    gpu = db.query("SELECT sum(power_w_avg), sum(energy_j) FROM gpu_1m").result_rows[0]
    assert node == pytest.approx(gpu) and db.query("SELECT sum(power_w) FROM rack_1m").result_rows[0][0] == \
        pytest.approx(gpu[0])
    store.record_rack_budgets(db, {"rack-000": 40_000.0})
    store.record_rack_budgets(db, {"rack-000": 20_000.0})  # the latest inventory counts
    racks = db.query("SELECT rack, power_w, budget_w, budget_share FROM rack_1m ORDER BY minute").result_rows
    assert {r[0] for r in racks} == {"rack-000"} and all(b == 20_000.0 and s == pytest.approx(p / b)
                                                          for _, p, b, s in racks)
    day = db.query("SELECT gpu_samples, gpus, hosts, gpu_power_w_max, throttled_share FROM fleet_1d").result_rows
    throttled = sum(1 for r in recs for g in r["gpus"] if g["throttle_reasons"] & THROTTLING)
    assert day == [(readings, 32, 4, max(g["power_w"] for r in recs for g in r["gpus"]),
                    pytest.approx(throttled / readings))]


def test_replayed_batches_change_no_rollup_and_no_table(db):
    for table in [*TABLES, *ROLLUPS]:  # parts stay as inserted, so comparing them is exact
        db.command(f"SYSTEM STOP MERGES {table}")
    parts = batches(records())
    insert_all(db, parts)
    before = snapshot(db)
    # a crash between insert and commit: the same batches, with the same tokens, stored again
    insert_all(db, [parts[0], parts[7], parts[-1]])
    assert snapshot(db) == before


def straggler_rows() -> list[tuple]:
    """One job's 8 ranks over three windows; rank 5 (on host h1) flagged in each."""
    rows = []
    for window in range(3):
        for rank in range(8):
            rec = {"ts": START + 60 * window + 60, "job": "j1", "rank": rank, "host": f"h{rank // 4}",
                   "window_start": START + 60 * window, "window_end": START + 60 * window + 60, "value": 1.0,
                   "median": 1.0, "mad": 0.1, "z": 5.0 if rank == 5 else 0.1, "slowdown_pct": 20.0 if rank == 5 else 0,
                   "flagged": rank == 5, "windows_flagged": 1, "windows_seen": 1, "job_slowdown_pct": 16.0}
            rows += TABLES["stragglers"].rows(rec, partition=0, offset=len(rows), kafka_ts_ms=0)
    return rows


def test_job_windows_keep_the_flagged_ranks_and_their_hosts(db):
    store.insert(db, "stragglers", TABLES["stragglers"].column_names, straggler_rows(), "stragglers|0:0-23")
    got = db.query("SELECT window_start, ranks, ranks_flagged, hosts_flagged, z_max, job_slowdown_pct "
                   "FROM job_windows ORDER BY window_start").result_rows
    assert [r[1:] for r in got] == [(8, 1, ["h1"], 5.0, 16.0)] * 3
    assert got[0][0] == datetime.fromtimestamp(START, timezone.utc).replace(tzinfo=None)


def test_a_store_made_before_the_rollups_has_them_filled_from_its_rows(db, clickhouse_url, clickhouse_database):
    insert_all(db, batches(records()))
    before = snapshot(db)
    for name, rollup in ROLLUPS.items():  # as a store made by the previous version
        for view in rollup.view_names():
            db.command(f"DROP VIEW {view}")
        db.command(f"DROP TABLE {name}")
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    after = snapshot(db)
    assert {k: v for k, v in after.items() if k != "parts"} == {k: v for k, v in before.items() if k != "parts"}


def test_retention_set_in_the_settings_reaches_the_live_tables(db, clickhouse_url, clickhouse_database):
    def ttl(table: str) -> str:
        return db.query("SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = "
                        "{t:String}", parameters={"t": table}).result_rows[0][0]

    assert "toIntervalDay(30)" in ttl("gpu_samples") and "toIntervalDay(730)" in ttl("rollup_gpu_1m")
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database,
                                          retention_telemetry_days=7, retention_rollup_days=1095))
    assert "toIntervalDay(7)" in ttl("gpu_samples") and "toIntervalDay(7)" in ttl("nccl_timings")
    assert "toIntervalDay(1095)" in ttl("rollup_gpu_1m") and "toIntervalDay(365)" in ttl("faults")


def test_tables_made_with_wide_parts_get_compact_parts_at_the_next_start(db, clickhouse_url, clickhouse_database):
    from schemas.ddl import WIDE_PART_BYTES

    def compact(table: str) -> bool:
        engine = db.query("SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = "
                          "{t:String}", parameters={"t": table}).result_rows[0][0]
        return f"min_bytes_for_wide_part = {WIDE_PART_BYTES}" in engine

    assert compact("gpu_samples") and compact("rollup_gpu_1m") and compact("faults")
    for table in ("gpu_samples", "rollup_gpu_1m"):  # as a store made before the schemas set it
        db.command(f"ALTER TABLE {table} RESET SETTING min_bytes_for_wide_part")
        assert not compact(table)
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    assert compact("gpu_samples") and compact("rollup_gpu_1m")


def test_a_rollup_made_by_another_version_is_reported_and_rebuilt_from_the_raw_rows(db, clickhouse_url,
                                                                                   clickhouse_database):
    from sinks import migrate

    insert_all(db, batches(records()))
    want = db.query("SELECT sum(samples), sum(energy_j) FROM gpu_1m").result_rows[0]
    db.command("ALTER TABLE rollup_gpu_1m DROP COLUMN gpu_model")
    assert store.schema_drift(db, clickhouse_database) == [
        "rollup_gpu_1m: columns differ from its rollup's current SELECT: ['gpu_model']"]
    assert migrate.migrate(db, clickhouse_database, "") == ["rollup_gpu_1m: dropped, to be refilled from gpu_samples"]
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    assert store.schema_drift(db, clickhouse_database) == []
    assert db.query("SELECT sum(samples), sum(energy_j) FROM gpu_1m").result_rows[0] == pytest.approx(want)
