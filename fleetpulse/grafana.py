"""`fleetpulse grafana [--out DIR]`: Grafana provisioning for the production shape: the ClickHouse data source
(grafana-clickhouse-datasource) and a fleet dashboard built from fleetpulse/panels.py, every panel raw SQL with the
data source's macros. deploy/grafana/ holds the files as this command writes them (a test keeps them equal)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fleetpulse.panels import PANELS, Panel

DATASOURCE_UID = "fleetpulse-clickhouse"
DATASOURCE = {"type": "grafana-clickhouse-datasource", "uid": DATASOURCE_UID}
DASHBOARD_UID = "fleetpulse-fleet"
HEIGHT = 8
# sqlutil.FormatQueryOption of the Grafana plugin SDK: 0 time series, 1 table.
FORMATS = {"timeseries": 0, "table": 1, "stat": 1, "bar": 1, "heatmap": 1, "timeline": 1}
PANEL_TYPES = {"timeseries": "timeseries", "table": "table", "stat": "stat", "bar": "barchart", "heatmap": "table",
               "timeline": "table"}  # Grafana: the timeline's rows as a table

DATASOURCE_YAML = f"""# Grafana provisioning: the store as a ClickHouse data source
# (plugin grafana-clickhouse-datasource >= 4).
# Grafana expands the ${{...}} variables from its environment. Give it a read-only ClickHouse user
# (the local server's fleetpulse_analyst, docs/clickhouse.md).
apiVersion: 1
datasources:
  - name: fleetpulse
    type: grafana-clickhouse-datasource
    uid: {DATASOURCE_UID}
    jsonData:
      host: ${{FLEETPULSE_GRAFANA_CLICKHOUSE_HOST}}
      port: ${{FLEETPULSE_GRAFANA_CLICKHOUSE_PORT}}
      protocol: http
      secure: false
      username: ${{FLEETPULSE_GRAFANA_CLICKHOUSE_USER}}
      defaultDatabase: ${{FLEETPULSE_CLICKHOUSE_DATABASE}}
    secureJsonData:
      password: ${{FLEETPULSE_GRAFANA_CLICKHOUSE_PASSWORD}}
"""

PROVIDER_YAML = """# Grafana provisioning: the fleetpulse dashboards, from the folder their JSON is mounted on.
apiVersion: 1
providers:
  - name: fleetpulse
    folder: fleetpulse
    type: file
    disableDeletion: true
    options:
      path: /var/lib/grafana/dashboards/fleetpulse
"""


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict:
    target = {"refId": "A", "datasource": DATASOURCE, "editorType": "sql", "format": FORMATS[panel.kind],
              "queryType": "timeSeries" if panel.kind == "timeseries" else "table", "rawSql": panel.sql.strip()}
    out = {"id": pid, "type": PANEL_TYPES[panel.kind], "title": panel.title, "description": panel.description,
           "datasource": DATASOURCE, "gridPos": {"h": HEIGHT, "w": panel.width, "x": x, "y": y},
           "targets": [target], "fieldConfig": {"defaults": {"unit": panel.unit} if panel.unit else {},
                                                "overrides": []}}
    if panel.kind == "bar":
        out["options"] = {"orientation": "horizontal", "xTickLabelRotation": 0}
    return out


def dashboard() -> dict:
    """The fleet dashboard: every panel of fleetpulse/panels.py, laid out left to right in rows of 24 columns."""
    panels, x, y = [], 0, 0
    for pid, panel in enumerate(PANELS, 1):
        if x + panel.width > 24:
            x, y = 0, y + HEIGHT
        panels.append(_panel(panel, pid, x, y))
        x += panel.width
    return {"uid": DASHBOARD_UID, "title": "fleetpulse: fleet", "tags": ["fleetpulse", "gpu"], "timezone": "utc",
            "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
            "editable": True, "panels": panels, "templating": {"list": []}, "annotations": {"list": []}}


def files() -> dict[str, str]:
    """Relative path -> contents of every provisioning file."""
    return {"provisioning/datasources/fleetpulse.yaml": DATASOURCE_YAML,
            "provisioning/dashboards/fleetpulse.yaml": PROVIDER_YAML,
            "dashboards/fleetpulse-fleet.json": json.dumps(dashboard(), indent=2) + "\n"}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("deploy/grafana"), help="folder to write (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    for rel, text in files().items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    return 0
