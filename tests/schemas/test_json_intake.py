"""The engine's extraction of gpu_samples' rows from raw records stores what Python's (Table.rows) stores, value for
value, on the real engine: drawn records, with numbers between the stored resolution's steps (rounded half to even by
both), optional fields left out, and records written over several lines."""

from __future__ import annotations

import time
import typing
import uuid

import orjson
import pytest
from clickhouse_connect.driver.httpclient import HttpClient
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from core.errors import DecodeError
from schemas.columns import INTEGER_TYPES, inner_type
from schemas import json_intake
from schemas.json_intake import INTAKES, JsonIntake
from schemas.tables import TABLES
from schemas.telemetry import GpuReading, HostSample
from schemas.topics import SAMPLES
from sinks import store
from tests.schemas.strategies import model_dicts

TABLE = TABLES["gpu_samples"]
INTAKE = INTAKES["gpu_samples"]
# GPU fields sent as floats and kept as whole 1/scale units: where Python's round() and the engine's must agree.
ROUNDED = {f.key: f.column.scale for f in TABLE.item_fields if inner_type(f.column.type) in INTEGER_TYPES
           and float in typing.get_args(GpuReading.model_fields[f.key].annotation)}
OPTIONAL_HEAD = [f.key for f in TABLE.fields if not f.required]
OPTIONAL_GPU = [f.key for f in TABLE.item_fields if not f.required]
SHAPES = [0, orjson.OPT_INDENT_2]


@st.composite
def records(draw) -> bytes:
    rec = draw(model_dicts(HostSample))
    for gpu in rec["gpus"]:
        for key, scale in ROUNDED.items():
            if gpu.get(key) is not None and draw(st.booleans()):
                gpu[key] += draw(st.sampled_from([0.5, -0.5, 0.4999999999, 0.25, -1e-9, 1.5])) / scale
        for key in draw(st.lists(st.sampled_from(OPTIONAL_GPU), max_size=6)):
            gpu.pop(key, None)
    for key in draw(st.lists(st.sampled_from(OPTIONAL_HEAD), max_size=3)):
        rec.pop(key, None)
    raw = orjson.dumps(rec, option=draw(st.sampled_from(SHAPES)))
    try:
        SAMPLES.decode(raw)
    except DecodeError:
        assume(False)  # nudged past a bound: the validator refuses it, and neither way stores it
    return draw(st.sampled_from([b"", b" \n", b"\t"])) + raw


def stored(client) -> list[tuple]:
    rows = client.query("SELECT * EXCEPT (ingested_at) FROM gpu_samples ORDER BY kafka_offset, gpu_index").result_rows
    client.command("TRUNCATE TABLE gpu_samples")
    return rows


def insert_lines(db, lines: list[bytes], token: str) -> None:
    """The sink's insert of JSON lines, the way it takes for this store: the request's body on a server, a file the
    embedded engine reads on chdb."""
    store.insert_lines(db, "gpu_samples", INTAKE, lines, token, embedded=not isinstance(db, HttpClient))


@pytest.mark.integration
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raws=st.lists(records(), min_size=1, max_size=12))
def test_the_engine_stores_every_column_as_python_does(db, raws):
    kafka_ts = 1_800_000_000_000
    rows = [row for off, raw in enumerate(raws) for row in TABLE.rows(SAMPLES.decode(raw), 5, off, kafka_ts + off)]
    store.insert(db, "gpu_samples", TABLE.column_names, rows, uuid.uuid4().hex)
    by_python = stored(db)
    lines = [INTAKE.line(raw, 5, off, kafka_ts + off) for off, raw in enumerate(raws)]
    insert_lines(db, lines, uuid.uuid4().hex)
    by_engine = stored(db)
    assert len(by_engine) == len(by_python) == sum(len(orjson.loads(r)["gpus"]) for r in raws)
    for python_row, engine_row in zip(by_python, by_engine):
        assert engine_row == python_row, [(c, p, e) for c, p, e in zip(TABLE.column_names, python_row, engine_row)
                                          if p != e]


@pytest.mark.integration
def test_a_batch_stored_again_under_its_token_adds_nothing_to_the_table_or_its_views(db):
    raws = [orjson.dumps({"host": "h1", "ts": 1_800_000_000.0 + k, "seq": k,
                          "gpus": [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"0000:{i:02x}:00.0",
                                    "power_w": 300.5 + i} for i in range(8)]}) for k in range(3)]
    lines = [INTAKE.line(raw, 0, off, 1_800_000_000_000) for off, raw in enumerate(raws)]
    for _ in range(2):
        insert_lines(db, lines, "samples|0:0-2")
    assert db.query("SELECT count(), sum(power_w) FROM gpu_samples").result_rows == [(24, 3 * (8 * 300.5 + 28))]
    assert db.query("SELECT sum(samples) FROM gpu_1m").result_rows == [(24,)]


@pytest.mark.integration
def test_a_batch_stored_one_way_and_replayed_the_other_under_its_token_adds_nothing(db):
    """A sink that crashed mid-insert and restarts with FLEETPULSE_SINK_JSON_INTAKE switched stores its batch in flight
    again the other way, under the same token: the engine must find it already stored."""
    now = float(int(time.time()))
    raws = [orjson.dumps({"host": "h2", "ts": now + k, "seq": k,
                          "gpus": [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"0000:{i:02x}:00.0",
                                    "power_w": 250.25 + i} for i in range(8)]}) for k in range(4)]
    rows = [row for off, raw in enumerate(raws) for row in TABLE.rows(SAMPLES.decode(raw), 0, off, int(now * 1000))]
    lines = [INTAKE.line(raw, 0, off, int(now * 1000)) for off, raw in enumerate(raws)]
    store.insert(db, "gpu_samples", TABLE.column_names, rows, "samples|0:0-3")
    insert_lines(db, lines, "samples|0:0-3")
    insert_lines(db, lines, "samples|1:0-3")
    store.insert(db, "gpu_samples", TABLE.column_names, rows, "samples|1:0-3")
    # Two batches (two tokens) of the same 32 rows, each stored once.
    assert db.query("SELECT count() FROM gpu_samples").result_rows == [(64,)]
    assert db.query("SELECT sum(samples) FROM gpu_1m").result_rows == [(64,)]


@pytest.mark.integration
def test_a_record_leaving_out_its_defaulted_fields_stores_their_defaults_with_no_default_applied_by_the_engine(
        db, tmp_path):
    """A server applies no DEFAULT to the rows of input(): the defaults are the SELECT's own, which this checks by
    turning the engine's off (for the request's body on a server, the file the embedded store reads)."""
    assert "DEFAULT" not in INTAKE.structure()
    now = float(int(time.time()))
    raw = orjson.dumps({"host": "h3", "ts": now, "seq": 1,
                        "gpus": [{"index": 0, "uuid": "GPU-0", "pci_bus_id": "0000:00:00.0"}]})
    line = INTAKE.line(raw, 0, 0, int(now * 1000))
    settings = {**json_intake.SETTINGS, "input_format_defaults_for_omitted_fields": 0}
    if isinstance(db, HttpClient):
        db.command(INTAKE.statement("gpu_samples"), data=line, settings=settings)
    else:
        path = tmp_path / "lines.jsonl"
        path.write_bytes(line)
        db.command(INTAKE.statement("gpu_samples", str(path)), settings=settings)
    by_engine = stored(db)
    store.insert(db, "gpu_samples", TABLE.column_names, TABLE.rows(SAMPLES.decode(raw), 0, 0, int(now * 1000)), "t")
    assert by_engine == stored(db)
    source, version = TABLE.column_names.index("source"), TABLE.column_names.index("schema_version")
    assert (by_engine[0][source], by_engine[0][version]) == ("nvml", 1)


def test_a_line_is_the_record_with_its_kafka_facts_first_on_one_line():
    assert JsonIntake.line(b' {"a": 1,\n "b": [2]}\n', 3, 7, 9) == \
        b'{"_fleetpulse_partition":3,"_fleetpulse_offset":7,"_fleetpulse_kafka_ts":9,"a": 1,  "b": [2]}'
    assert JsonIntake.line(b"{ }", 0, 0, 0) == \
        b'{"_fleetpulse_partition":0,"_fleetpulse_offset":0,"_fleetpulse_kafka_ts":0 }'


def test_the_server_statement_reads_the_body_and_parses(db):
    sql = INTAKE.statement("telemetry.gpu_samples")
    assert "FROM input('" in sql and sql.endswith("FORMAT JSONEachRow")
    formatted = db.query("SELECT formatQuery({q:String})", parameters={"q": sql}).result_rows[0][0]
    assert formatted.startswith("INSERT INTO telemetry.gpu_samples")


def test_only_a_table_with_a_list_of_elements_and_no_legacy_form_is_extracted_by_the_engine():
    with pytest.raises(ValueError, match="xid_events"):
        JsonIntake(TABLES["xid_events"])
    with pytest.raises(ValueError, match="nccl_timings"):
        JsonIntake(TABLES["nccl_timings"])
