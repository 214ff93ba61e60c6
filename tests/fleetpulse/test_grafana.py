"""Grafana provisioning as shipped in deploy/grafana equals what `fleetpulse grafana` writes, and the panels' macros
expand as grafana-clickhouse-datasource documents them (its pkg/macros). Every panel running and returning rows on a
store a pipeline run filled is tests/evaluate/test_scenarios.py's demo test."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fleetpulse import grafana
from fleetpulse.panels import PANELS, expand

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 12, 1, 10, 0, 0, 250_000, tzinfo=timezone.utc)
END = datetime(2026, 12, 1, 16, 30, 0, tzinfo=timezone.utc)


def test_deploy_grafana_is_what_the_command_writes(tmp_path):
    grafana.run(argparse.Namespace(out=tmp_path))
    for rel, text in grafana.files().items():
        assert (ROOT / "deploy/grafana" / rel).read_text() == text == (tmp_path / rel).read_text(), rel


def test_every_panel_queries_the_provisioned_data_source_with_a_time_range():
    board = grafana.dashboard()
    assert len(board["panels"]) == len(PANELS) and len({p["id"] for p in board["panels"]}) == len(PANELS)
    for panel in board["panels"]:
        target = panel["targets"][0]
        assert target["datasource"]["uid"] == grafana.DATASOURCE_UID and target["editorType"] == "sql"
        assert "$__timeFilter(" in target["rawSql"] or "$__toTime" in target["rawSql"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    assert f"uid: {grafana.DATASOURCE_UID}" in grafana.DATASOURCE_YAML
    assert "type: grafana-clickhouse-datasource" in grafana.DATASOURCE_YAML


@pytest.mark.parametrize("macro, want", [
    ("$__timeFilter(ts)", "ts >= toDateTime(1796119200) AND ts <= toDateTime(1796142600)"),
    ("$__timeFilter_ms(ts)",
     "ts >= fromUnixTimestamp64Milli(1796119200250) AND ts <= fromUnixTimestamp64Milli(1796142600000)"),
    ("$__dateFilter(day)", "day >= toDate('2026-12-01') AND day <= toDate('2026-12-01')"),
    ("$__timeInterval(minute)", "toStartOfInterval(toDateTime(minute), INTERVAL 60 second)"),
    ("$__timeInterval_ms(ts)", "toStartOfInterval(toDateTime64(ts, 3), INTERVAL 60000 millisecond)"),
    ("x <= $__toTime_ms)", "x <= fromUnixTimestamp64Milli(1796142600000))"),
    ("$__fromTime, $__toTime", "toDateTime(1796119200), toDateTime(1796142600)"),
    ("$__interval_s", "60"),
])
def test_macros_expand_as_the_data_source_documents(macro, want):
    assert expand(macro, START, END, 60) == want


def test_unknown_macros_and_missing_columns_are_refused():
    with pytest.raises(ValueError, match="unknown macro"):
        expand("SELECT $__conditionalAll(x)", START, END, 60)
    with pytest.raises(ValueError, match="needs a column"):
        expand("WHERE $__timeFilter()", START, END, 60)


def test_the_dashboard_json_is_valid_and_has_no_sql_placeholders_left():
    board = json.loads((ROOT / "deploy/grafana/dashboards/fleetpulse-fleet.json").read_text())
    for panel in board["panels"]:
        sql = expand(panel["targets"][0]["rawSql"], START, END, 60)
        assert "$__" not in sql and "{" not in sql.replace("{'", ""), panel["title"]
