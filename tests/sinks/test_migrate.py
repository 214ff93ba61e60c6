"""`fleetpulse migrate` on the real engine: a store made by the previous gpu_samples layout (Float64 counters, power in
watts, plain-String UUIDs) is rebuilt in the compact one with every value kept and the watermark view still fed."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import pytest

from agents.simulator.simulate import FleetSimulator
from core.clickhouse import connect
from core.errors import StoreError
from core.settings import CommonSettings
from schemas.tables import TABLES
from schemas.topics import SAMPLES
from sinks import migrate, store
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings

V1 = Path(__file__).with_name("data") / "gpu_samples_v1.sql"  # `fleetpulse ddl` of gpu_samples before 2026-12-02


@pytest.fixture
def db(clickhouse_url, clickhouse_database):
    cfg = CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database)
    client = connect(cfg, "owner")
    client.command(V1.read_text().replace("{database}", clickhouse_database))
    store.apply_schema(client, cfg)  # every other table, and the watermark view on the old gpu_samples
    yield client


NEWER = ("power_default_limit_w",)  # fields added since the v1 layout: its agents never sent them


def _records() -> list[dict]:
    sim = FleetSimulator(3, seed=5, start_ts=float(int(datetime.now().timestamp())) - 600, nccl_interval=0)
    samples = [s for _ in range(20) for s in sim.step().samples]
    for g in (g for s in samples for g in s["gpus"]):
        for name in NEWER:
            del g[name]
    return samples


def _old_rows(records: list[dict]) -> tuple[list[str], list[tuple]]:
    """The rows the previous sink stored: the same values, scaled columns in their field's unit and name."""
    table = TABLES["gpu_samples"]
    keep = [i for i, c in enumerate(table.columns) if c.read_as not in NEWER]
    names = [table.columns[i].read_as for i in keep]
    scale = [table.columns[i].scale for i in keep]
    rows = [tuple(row[i] / s if s != 1 and row[i] is not None else row[i] for i, s in zip(keep, scale))
            for off, r in enumerate(records) for row in table.rows(r, 0, off, round(r["ts"] * 1000))]
    return names, rows


def test_an_old_store_is_rebuilt_with_every_value_kept(db, clickhouse_url, clickhouse_database):
    records = _records()
    names, rows = _old_rows(records)
    db.insert("gpu_samples", rows, column_names=names)
    # apply_schema (in the fixture, as in the sink before it refuses) added the columns the layout gained, empty
    assert "power_mw" in migrate.live_columns(db, clickhouse_database, "gpu_samples")
    drift = store.schema_drift(db, clickhouse_database)
    assert any(p.startswith("gpu_samples.") for p in drift) and not any(p.startswith("xid_events") for p in drift)
    sink = ClickHouseSink(SinkSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    with pytest.raises(StoreError, match="fleetpulse migrate"):  # the sink refuses the old layout, naming the way out
        asyncio.run(sink.open_store())

    done = migrate.migrate(db, clickhouse_database, "", keep_old=False)

    assert done == [f"gpu_samples: {len(rows)} rows copied into the current layout"]
    assert store.schema_drift(db, clickhouse_database) == []
    assert migrate.migrate(db, clickhouse_database, "") == []  # nothing left to do
    # the rollups, made once the tables match, are filled from the rows the store holds
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    assert db.query("SELECT sum(samples) FROM gpu_1m").result_rows == [(len(rows),)]
    assert db.query("SELECT sum(gpu_samples) FROM fleet_1d").result_rows == [(len(rows),)]
    table = TABLES["gpu_samples"]
    fields = [(f, f.column.read_as) for f in table.fields + table.item_fields]
    back = db.query(f"SELECT {', '.join(n for _, n in fields)} FROM gpu_samples").result_rows
    assert len(back) == len(rows)
    sent = {(r["host"], r["seq"], g["index"]): {**r, **g} for r in records for g in r["gpus"]}
    changed = []
    for row in back:
        got = dict(zip((n for _, n in fields), row))
        want = sent.pop((got["host"], got["seq"], got["gpu_index"]))
        for f, name in fields:
            value = got[name]
            if isinstance(value, datetime):
                value = value.timestamp()
            if value != want.get(f.key, f.default):
                changed.append((name, value, want.get(f.key, f.default)))
    assert changed == [] and sent == {}
    old = db.query("SELECT name FROM system.tables WHERE database = {d:String} AND startsWith(name, 'gpu_samples__')",
                   parameters={"d": clickhouse_database}).result_rows
    assert old == []


def test_the_watermark_and_rollup_views_follow_the_rebuilt_table_and_the_old_one_can_be_kept(
        db, clickhouse_url, clickhouse_database):
    records = _records()
    names, rows = _old_rows(records)
    db.insert("gpu_samples", rows, column_names=names)
    migrate.migrate(db, clickhouse_database, "", keep_old=True)
    store.apply_schema(db, CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database))
    table = TABLES["gpu_samples"]
    store.insert(db, "gpu_samples", table.column_names, table.rows(records[0], 0, 10_000), token="after-migration")
    assert store.watermarks(db)[(SAMPLES.name, 0)] == 10_000
    assert db.query("SELECT sum(gpu_samples) FROM fleet_1d").result_rows == [(len(rows) + len(records[0]["gpus"]),)]
    kept = db.query("SELECT name FROM system.tables WHERE database = {d:String} "
                    "AND startsWith(name, 'gpu_samples__before_')", parameters={"d": clickhouse_database}).result_rows
    assert len(kept) == 1 and db.query(f"SELECT count() FROM {kept[0][0]}").result_rows[0][0] == len(rows)
