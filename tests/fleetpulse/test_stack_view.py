"""What `fleetpulse up` shows as its event feed, asked of the real engine: every alert names its subject (a GPU, a
rack, a job or the fleet), not an empty host."""

from __future__ import annotations

from fleetpulse.stack_view import EVENTS_SQL, StackView
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


def full_view() -> StackView:
    """A view with everything a busy run shows: every topic moving, every table holding rows, 20 events."""
    from schemas.tables import TABLES
    from schemas.topics import TOPICS

    view = StackView(plain=True, hosts=100)
    view.last = {"messages": {t.full(""): 1000 for t in TOPICS.values()},
                 "rates": {t.full(""): 1234.0 for t in TOPICS.values()},
                 "rows": {name: 1_234_567 for name in TABLES}, "dead_letters": 0, "store": "taking writes",
                 "alerts_firing": 3, "usable_compute": 0.994, "installed_gpus": 800, "interruptions": 2, "drains": 1,
                 "returns": 1, "stragglers": 2,
                 "events": [f"node       gpu-node-{k:04d} healthy -> suspect: a reason long enough to need "
                            "cutting at eighty columns" for k in range(20)]}
    return view


def test_the_live_view_fits_an_80_by_24_terminal_and_says_what_it_left_out():
    lines = full_view().lines(80, 23)
    assert len(lines) <= 23 and all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "usable compute 99.4% of 800 GPUs" in text and "drains 1 · returned 1 · stragglers 2" in text
    assert "store: taking writes" in text and "events (newest first):" in text
    assert " … +" in text  # the topics and tables that did not fit are counted, not cut silently
    assert lines[-1].startswith("  node       gpu-node-")


def test_a_larger_terminal_shows_more_of_the_events():
    small, large = full_view().lines(80, 23), full_view().lines(200, 50)
    count = sum(line.startswith("  node") for line in large)
    assert count == 20 > sum(line.startswith("  node") for line in small)
    assert all(len(line) <= 200 for line in large)
