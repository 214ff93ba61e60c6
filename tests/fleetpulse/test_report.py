"""`fleetpulse report` on the real engine: a store holding two hours of a small fleet's derived messages (some
delivered twice, as a restarted worker does) gives each figure worked out by hand below."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from core.settings import CommonSettings
from fleetpulse import report
from schemas.tables import TABLES
from core.clickhouse import connect
from sinks import store
from tests.conftest import _free_port

D = datetime(2026, 11, 30, tzinfo=timezone.utc).timestamp()  # midnight
M = 60.0


def put(client, table: str, records: list[dict], batch: str = "test") -> None:
    t = TABLES[table]
    rows = [row for off, rec in enumerate(records) for row in t.rows(rec, 0, off, 0)]
    store.insert(client, table, t.column_names, rows, f"{table}-{batch}")  # one dedup token per batch


def state(host, to, prev, at, fault_id=None) -> dict:
    return {"host": host, "state": to, "prev_state": prev, "since": at, "ts": at, "schedulable": to == "healthy",
            "reason": "test", "evidence": {"fault_id": fault_id} if fault_id else {}}


def fault(fault_id, host, code, bin_, at, rule="catalog") -> dict:
    return {"fault_id": fault_id, "ts": at, "host": host, "code": code, "bin": bin_, "rule": rule,
            "first_ts": at, "last_ts": at}


@pytest.fixture
def filled(clickhouse_url, clickhouse_database):
    cfg = CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database,
                         sink_port=_free_port())  # no sink there: the report asks the store itself
    store.prepare(cfg)
    client = connect(cfg, "owner")
    minutes = [{"minute_ts": D + k * M, "nodes": 10, "installed_gpus": 80.0, "schedulable_gpus": 80.0,
                "usable_gpus": 72.0 if k < 60 else 80.0, "usable_compute": 0.9 if k < 60 else 1.0,
                "breakdown": {"drained": 0.1 if k < 60 else 0.0}, "breakdown_gpus": {"drained": 8.0 if k < 60 else 0.0}}
               for k in range(120)]
    put(client, "usable_compute", minutes + minutes[:5])  # five minutes delivered twice
    f1 = fault("f1", "h1", "xid:79", "reboot", D + 10 * M)
    # h1's fault logged Xid 79 then Xid 154 (its recovery action): one interruption, led by Xid 79
    echo = fault("f1b", "h1", "xid:154", "reboot", D + 10 * M + 4, "workflow_154")
    put(client, "faults", [echo, f1, f1, fault("f2", "h2", "xid:48", "reset", D + 20 * M),
                           fault("f3", "h3", "xid:13", "ignore", D + 30 * M)])
    put(client, "node_states", [
        state("h1", "drain_requested", "healthy", D + 10.5 * M, "f1"),
        state("h1", "drained", "drain_requested", D + 12 * M),
        state("h1", "repairing", "drained", D + 13 * M), state("h1", "validating", "repairing", D + 30 * M),
        state("h1", "healthy", "validating", D + 40 * M), state("h1", "healthy", "validating", D + 40 * M),
        state("h1", "drain_requested", "healthy", D + 70 * M),  # failed again half an hour after its return
        state("h2", "drain_requested", "healthy", D + 21 * M, "f2"), state("h2", "validating", "repairing", D + 41 * M),
        state("h2", "healthy", "validating", D + 45 * M),
    ])
    stops = {"mode": "immediate", "cost.gpu_hours": "25.3", "cost.gpu_hours_job": "21.3", "cost.ranks_stopped": "8"}
    waits = {"mode": "after_jobs", "cost.gpu_hours": "192.0", "cost.gpu_hours_job": "0.0", "cost.ranks_stopped": "0",
             "cost.gpu_hours_saved": "341.3"}
    put(client, "drain_events", [{"event_id": e, "host": h, "action": "drain", "ts": at, "reason": "test",
                                  "evidence": ev}
                                 for e, h, at, ev in (("e1", "h1", D + 10.5 * M, stops),
                                                      ("e2", "h2", D + 21 * M, waits), ("e3", "h1", D + 70 * M, {}),
                                                      ("e1", "h1", D + 10.5 * M, stops))])
    offender = {"event_id": "e4", "host": "h2", "action": "drain", "ts": D + 90 * M, "reason": "repeat offender: ...",
                "evidence": {"repair": "replace", "recurrence": "3", "recurring_repair": "reset",
                             "returned_at": f"{D - 3600:.0f},{D + 45 * M:.0f}"}}
    put(client, "drain_events", [offender, offender], "offender")  # delivered twice
    firing = {"status": "firing", "alertname": "GpuThermal", "severity": "warning", "value": 90.0, "threshold": 87.0,
              "summary": "hot", "host": "h4", "gpu_index": 3}
    put(client, "alerts", [{**firing, "fingerprint": "a", "ts": D + s, "starts_at": D + s} for s in (300, 300, 3000)]
        + [{**firing, "status": "resolved", "fingerprint": "a", "ts": D + 400, "starts_at": D + 300}])
    put(client, "stragglers", [{"ts": D + 61 * M, "job": "j1", "rank": r, "host": f"h{r // 8}",
                                "window_start": D + 60 * M, "window_end": D + 61 * M, "value": 1.0, "median": 1.0,
                                "mad": 0.1, "z": 6.0 if r == 9 else 0, "slowdown_pct": 12.0 if r == 9 else 0,
                                "flagged": r == 9, "windows_flagged": 1, "windows_seen": 1, "job_slowdown_pct": 10.0}
                               for r in range(16)])
    yield cfg
    client.command(f"DROP DATABASE IF EXISTS {clickhouse_database}")


def test_every_figure_over_two_hours(filled):
    r = report.build(filled, datetime.fromtimestamp(D, timezone.utc), datetime.fromtimestamp(D + 120 * M, timezone.utc))
    u = r["usable_compute"]
    assert (u["minutes"], u["installed_gpu_hours"], u["gpu_weighted"], u["full_minutes_mean"]) == \
        (120, 160.0, 0.95, 0.95)
    # 8 GPUs drained for 60 minutes: 8 GPU-hours lost to drains, none elsewhere
    assert u["gpu_hours_lost"] == {"drains": 8.0, "faults_before_drain": 0.0, "stragglers": 0.0, "throttling": 0.0}
    assert u["per_day"] == [{"day": "2026-11-30", "minutes": 120, "nodes": 10, "usable_compute": 0.95,
                             "breakdown": {"drained": 0.05}}]
    i = r["interruptions"]
    assert (i["total"], i["ignored"], i["hours"]) == (2, 1, 2.0)  # xid:13 is binned ignore: no interruption
    assert {(b["code"], b["interruptions"], b["mtbi_h"], b["gpu_hours_between"]) for b in i["by_bin_and_cause"]} == \
        {("xid:79", 1, 2.0, 160.0), ("xid:48", 1, 2.0, 160.0), ("xid:13", 1, 2.0, 160.0)}
    d = r["drains"]
    assert (d["requested"], d["hosts"], d["episodes"], d["returned"], d["replaced"]) == (4, 2, 3, 2, 0)
    # each request's own estimate once (e1 was delivered twice), e3 and the offender's with none
    assert (d["gpu_hours_at_stake"], d["gpu_hours_at_stake_jobs"], d["stopped_jobs"], d["after_jobs"],
            d["gpu_hours_saved_after_jobs"]) == (217.3, 21.3, 1, 1, 341.3)
    # quantiles interpolate between the two episodes' figures (30 and 60 s; 1,170 and 1,200 s; 600 and 240 s)
    assert d["times"]["fault_to_drain_requested"] == {"n": 2, "p50_s": 45.0, "p95_s": 58.5}
    assert d["times"]["drain_requested_to_repaired"] == {"n": 2, "p50_s": 1185.0, "p95_s": 1198.5}
    assert d["times"]["validating_to_returned"] == {"n": 2, "p50_s": 420.0, "p95_s": 582.0}
    rep = r["repeat_after_repair"]
    assert (rep["returns"], rep["failed_again"], rep["share"]) == (2, 1, 0.5)
    assert rep["worst"] == [{"host": "h1", "returns": 1, "failed_again": 1}]
    assert rep["sent_to_replace"] == [{"host": "h2", "drained_at": D + 90 * M, "repair": "reset", "drains": 3,
                                       "returned_at": f"{D - 3600:.0f},{D + 45 * M:.0f}"}]
    assert r["alerts"]["by_name"] == [{"alertname": "GpuThermal", "severity": "warning", "fired": 2,
                                       "per_1000_gpu_days": 300.0}]  # 2 over 160 GPU-hours = 6.67 GPU-days
    assert (r["alerts"]["pages"], r["alerts"]["pages_by_name"]) == (2, {"GpuThermal": 2})  # no incident's condition
    s = r["stragglers"]
    assert (s["windows_flagged"], s["jobs"], s["hosts"], s["job_seconds_lost"]) == (1, 1, ["h1"], 6.0)
    text = report.render(r)
    assert "usable compute      95.0 % of installed GPU-hours (0.95;" in text and "h1: 1 of 1" in text
    assert "GPU-hours lost: 8.0 to drains and repairs, 0.0 to faults before a drain" in text
    assert ("at stake as requested: 217.3 GPU-h (21.3 of jobs stopped by 1 drains at once; 1 drains waited for "
            "their job, saving 341.3 GPU-h against stopping it)") in text
    assert r["notes"] == ["alert rates per 1,000 GPU-days are extrapolated from 6.67 GPU-days (x150): read the counts"]
    assert f"h2: sent to replace at {D + 90 * M:.0f}, drain 3 for reset" in text


def test_the_default_range_starts_at_the_store_s_first_minute(filled):
    r = report.build(filled, None, datetime.fromtimestamp(D + 120 * M, timezone.utc))
    assert r["from"].startswith("2026-11-30T00:00:00") and r["usable_compute"]["minutes"] == 120


@pytest.mark.parametrize("doc", ["outcomes.md", "rollups.md"])
def test_every_query_in_the_analysts_docs_runs(filled, doc):
    from fleetpulse.query import query
    from tests.conftest import REPO

    text = (REPO / "docs" / doc).read_text()
    sql = "".join(b.split("```")[0] for b in text.split("```sql\n")[1:])
    sql = sql.replace("{from}", "toDateTime64('2026-11-30 00:00:00', 3, 'UTC')")
    sql = sql.replace("{to}", "toDateTime64('2026-11-30 02:00:00', 3, 'UTC')")
    statements = [s for s in sql.split(";") if s.strip()]
    assert len(statements) >= 5
    for statement in statements:
        query(filled, statement)  # raises StoreError on any error


def test_the_command_prints_json_or_a_table_and_refuses_a_bad_time(filled, monkeypatch, capsys):
    import argparse

    import orjson

    for key, value in (("CLICKHOUSE_URL", filled.clickhouse_url), ("CLICKHOUSE_DATABASE", filled.clickhouse_database),
                       ("SINK_PORT", str(filled.sink_port))):
        monkeypatch.setenv(f"FLEETPULSE_{key}", value)
    args = argparse.Namespace(start="2026-11-30", end="2026-11-30T02:00:00", json=True)
    assert report.run(args) == 0
    assert orjson.loads(capsys.readouterr().out)["drains"]["requested"] == 4
    assert report.run(argparse.Namespace(start="2026-11-30", end=None, json=False)) == 0
    assert "interruptions       2 in" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--from 'yesterday' is not an ISO date or time"):
        report.run(argparse.Namespace(start="yesterday", end=None, json=False))
    with pytest.raises(SystemExit, match="--to 2026-11-29 is not after --from 2026-11-30: give --from first"):
        report.run(argparse.Namespace(start="2026-11-30", end="2026-11-29", json=False))


def test_a_range_with_events_but_no_minute_yet_says_so(filled):
    """Early in a run: the drain's minute is not over yet, so usable compute is not known, but the fault, the drain
    and the return are counted (the range is not collapsed to an instant)."""
    at = datetime.fromtimestamp(D + 10 * M + 1, timezone.utc)  # inside minute 10: no minute starts after it
    r = report.build(filled, at, datetime.fromtimestamp(D + 10 * M + 59, timezone.utc))
    assert r["usable_compute"]["minutes"] == 1  # the minute holding the range's start overlaps it
    r = report.build(filled, datetime.fromtimestamp(D + 200 * M, timezone.utc),
                     datetime.fromtimestamp(D + 300 * M, timezone.utc))
    assert r["usable_compute"]["gpu_weighted"] is None
    assert r["notes"][0].startswith("nothing is stored in this range; the store holds 2026-11-30 00:00:00 to")
    text = report.render(r)
    assert "usable compute      not known" in text and "note: nothing is stored in this range" in text


def test_figures_of_a_range_without_minutes_but_with_a_drain(filled):
    from fleetpulse import outcomes

    ask = outcomes.asker(filled)
    client = connect(filled, "owner")
    client.command(f"TRUNCATE TABLE {filled.clickhouse_database}.usable_compute")
    r = outcomes.figures(ask, outcomes.resolve(ask, None, None))
    assert r["from"].startswith("2026-11-30T00:05:00")  # the first alert, not an instant at the end
    assert (r["interruptions"]["total"], r["drains"]["requested"], r["drains"]["returned"]) == (2, 4, 2)
    assert r["notes"][0].startswith("no usable-compute minute in this range yet")
    with pytest.raises(outcomes.RangeError, match="give --from before --to"):
        outcomes.Range(datetime.fromtimestamp(D + M, timezone.utc), datetime.fromtimestamp(D, timezone.utc))
