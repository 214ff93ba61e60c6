"""What `fleetpulse up` shows as its event feed, asked of the real engine: every alert names its subject (a GPU, a
rack, a job or the fleet), not an empty host."""

from __future__ import annotations

from fleetpulse.stack_view import EVENTS_SQL
from tests.fleetpulse.test_report import D, put


def alert(name: str, *, host: str = "", gpu=None, rack: str = "", labels=None) -> dict:
    return {"fingerprint": name + host + rack, "status": "firing", "alertname": name, "severity": "warning",
            "ts": D + 5, "starts_at": D, "host": host, "rack": rack, "gpu_index": gpu, "value": 1.0,
            "threshold": 1.0, "summary": "", "labels": labels or {}}


def test_each_alert_line_names_its_gpu_rack_job_or_the_fleet(db):
    put(db, "alerts", [alert("GpuTempSlowdown", host="h1", gpu=3), alert("RackSilent", rack="r7"),
                       alert("JobStalled", labels={"job": "job-0004"}), alert("FleetSilent")])
    lines = sorted(line for _, line in db.query(EVENTS_SQL).result_rows)
    assert lines == ["alert      FleetSilent on the fleet", "alert      GpuTempSlowdown on h1 GPU 3",
                     "alert      JobStalled on job job-0004", "alert      RackSilent on rack r7"]
