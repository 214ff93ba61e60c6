"""`fleetpulse ddl --cluster`: every statement parses on the real engine, each table keeps its rows in a replicated
local table under a Distributed one, and a store made from it holds exactly what a one-server store holds
(tests/schemas/cluster_emulation.py runs it on the real engine, less replication)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import CommonSettings, load
from schemas.ddl import statements
from schemas.layout import Layout
from schemas.rollups import ROLLUPS
from schemas.tables import TABLES

CLUSTER = Layout("telemetry", "fleet")
ROOT = Path(__file__).resolve().parents[2]


def test_every_cluster_statement_parses_on_the_real_engine(db):
    stmts = statements(CLUSTER)
    for stmt in stmts:
        assert " ON CLUSTER fleet" in stmt.splitlines()[0], stmt.splitlines()[0]
        formatted = db.query("SELECT formatQuery({q:String})", parameters={"q": stmt}).result_rows[0][0]
        assert "ON CLUSTER fleet" in formatted
        assert db.command(f"EXPLAIN AST {stmt}").startswith(("CreateQuery", "AlterQuery"))  # no FORMAT appended
    engines = re.findall(r"ENGINE = (\w+)", "\n".join(stmts))
    assert engines and all(e.startswith("Replicated") or e == "Distributed" for e in engines), set(engines)
    assert not any("non_replicated" in s for s in stmts)


def test_each_table_and_rollup_is_distributed_over_its_replicated_local_table():
    text = "\n".join(statements(CLUSTER))
    for name in [*TABLES, *ROLLUPS, "sink_watermarks", "sink_inflight", "sink_topic_resets", "rack_budgets"]:
        assert f"CREATE TABLE IF NOT EXISTS telemetry.{name}_local ON CLUSTER fleet" in text, name
        assert f"'/clickhouse/tables/{{shard}}/telemetry/{name}_local', '{{replica}}'" in text, name
        assert re.search(rf"telemetry\.{name} ON CLUSTER fleet AS telemetry\.{name}_local\n"
                         rf"ENGINE = Distributed\(fleet, telemetry, {name}_local, cityHash64\(", text), name
    # every materialized view reads and writes local tables: each shard rolls up the rows it was sent
    for src, dst in re.findall(r"MATERIALIZED VIEW .* TO (\S+)\nAS .*?FROM (\S+)", text, re.S):
        assert src.endswith("_local") and dst.endswith("_local"), (src, dst)
    assert "FROM telemetry.gpu_samples_local" in text and "FROM telemetry.rollup_gpu_1m\n" in text


def test_one_server_ddl_is_unchanged_by_the_cluster_layout():
    assert statements() == statements(Layout("fleetpulse"))
    assert not any("ON CLUSTER" in s or "Distributed" in s or "Replicated" in s for s in statements())


def test_a_cluster_needs_a_server_url():
    with pytest.raises(ConfigError, match="FLEETPULSE_CLICKHOUSE_CLUSTER"):
        load(CommonSettings, clickhouse_cluster="fleet", clickhouse_url=None)
    assert load(CommonSettings, clickhouse_cluster="fleet",
                clickhouse_url="http://ch-0:8123").clickhouse_cluster == "fleet"


def test_a_cluster_store_holds_what_a_one_server_store_holds(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.schemas.cluster_emulation", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    one, fleet = got["one"], got["fleet"]
    engines = dict(fleet.pop("engines"))
    one.pop("engines")
    assert one == fleet
    assert fleet["rows:gpu_samples"] == 6400 and len(fleet["gpu_1m"]) == 128 and len(fleet["job_windows"]) == 3
    assert fleet["drift"] == [] and fleet["watermarks"]
    for name in [*TABLES, *ROLLUPS]:
        assert engines[name] == "Distributed" and engines[f"{name}_local"].endswith("MergeTree"), name
