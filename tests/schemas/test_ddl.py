"""The generated DDL creates the live tables it describes, and rows from messages read back unchanged."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings as hsettings

from core.errors import DecodeError
from schemas.codec import decode, encode
from schemas.tables import TABLES
from sinks import store
from tests.schemas.strategies import model_dicts


def test_live_tables_match_the_generated_ddl(db, clickhouse_database):
    assert store.schema_drift(db, clickhouse_database) == []
    assert set(TABLES) <= {r[0] for r in db.query("SHOW TABLES").result_rows}


def test_drift_is_reported_with_the_column_named(db, clickhouse_database):
    db.command("ALTER TABLE gpu_samples MODIFY COLUMN power_w Nullable(Float32)")
    db.command("ALTER TABLE alerts ADD COLUMN surprise UInt8")
    drift = store.schema_drift(db, clickhouse_database)
    assert any(p.startswith("gpu_samples.power_w: expected Nullable(Float64)") for p in drift)
    assert any(p.startswith("alerts:") and "surprise" in p for p in drift)


def _epoch_ms(value: datetime | None) -> int | None:
    """DateTime64(3, 'UTC') reads back as a datetime in UTC; the insert value was epoch milliseconds."""
    return None if value is None else round(value.replace(tzinfo=timezone.utc).timestamp() * 1000)


@pytest.mark.parametrize("name", list(TABLES))
def test_rows_from_any_valid_message_read_back_unchanged(db, name):
    table = TABLES[name]
    names = table.column_names
    offset = iter(range(10**6))

    @hsettings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
               deadline=None)
    @given(model_dicts(table.topic.model))
    def check(value):
        message = decode(encode(table.topic.model.model_validate(value)))
        off = next(offset)
        rows = table.rows(message, partition=3, offset=off, kafka_ts_ms=int(time.time() * 1000))
        assert len(rows) == (len(message[table.items]) if table.items else 1)
        db.insert(table.name, rows, column_names=names)
        back = db.query(f"SELECT {', '.join(names)} FROM {table.name} WHERE kafka_offset = {off}").result_rows
        assert len(back) == len(rows)
        got_rows = sorted((tuple(_epoch_ms(v) if "DateTime64" in c.type else v for c, v in zip(table.columns, row))
                           for row in back), key=repr)  # a list field's rows come back in the sort key's order
        for got_row, want_row in zip(got_rows, sorted(rows, key=repr)):
            for col, got, exp in zip(table.columns, got_row, want_row):
                assert got == exp, f"{table.name}.{col.name}: {got!r} != {exp!r}"

    check()


@pytest.mark.parametrize(
    "record, message",
    [
        ([], "expected a JSON object"),
        ({"host": "h"}, "missing field"),
        ({"host": 7, "ts": 1.7e9, "seq": 1, "gpus": [{"index": 0, "uuid": "u", "pci_bus_id": "p"}]}, "field 'host'"),
        ({"host": "h", "ts": 1.7e9, "seq": 1, "gpus": [{"index": 0, "uuid": "u", "pci_bus_id": "p", "power_w": "hot"}]},
         "field 'power_w': expected number"),
    ],
)
def test_malformed_samples_are_refused_with_the_field_named(record, message):
    with pytest.raises(DecodeError, match=message):
        TABLES["gpu_samples"].rows(record, 0, 0)


def test_scaled_counters_read_back_in_their_unit_as_sent(db):
    """power_w, power_limit_w, power_default_limit_w, sm_active and tensor_active are stored as whole mW and per-mille:
    their ALIAS columns give back exactly the floats the record carried (at that resolution, which is what NVML and
    DCGM report)."""
    table = TABLES["gpu_samples"]
    scaled = [c.alias.name for c in table.aliases if c.scale != 1]
    assert sorted(scaled) == ["power_default_limit_w", "power_limit_w", "power_w", "sm_active", "tensor_active"]
    offset = iter(range(10**6))

    @hsettings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
               deadline=None)
    @given(model_dicts(table.topic.model))
    def check(value):
        message = decode(encode(table.topic.model.model_validate(value)))
        off = next(offset)
        db.insert(table.name, table.rows(message, 0, off), column_names=table.column_names)
        sql = f"SELECT gpu_index, {', '.join(scaled)} FROM gpu_samples WHERE kafka_offset = {off}"
        back = db.query(sql).result_rows
        sent = {g["index"]: g for g in message["gpus"]}
        assert len(back) == len(sent)
        for index, *values in back:
            for name, got in zip(scaled, values):
                assert got == sent[index].get(name), f"{name}: {got!r} != {sent[index].get(name)!r}"

    check()


def test_a_finer_reading_is_rounded_to_the_stored_resolution():
    """A producer with more digits than NVML's loses only what is below the column's resolution."""
    row = dict(zip(TABLES["gpu_samples"].column_names, TABLES["gpu_samples"].rows(
        {"host": "h", "ts": 1.7e9, "seq": 1, "gpus": [{"index": 0, "uuid": "u", "pci_bus_id": "p", "power_w": 412.3456,
                                                        "sm_active": 0.12345, "gpu_temp_c": 61.6}]}, 0, 0)[0]))
    assert (row["power_mw"], row["sm_active_permille"], row["gpu_temp_c"]) == (412346, 123, 62)
