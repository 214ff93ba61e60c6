"""Every shipped evaluation scenario through the real pipeline (broker, stream worker, sink, ClickHouse engine),
its report asserted. Fleets are the scenarios' own except llama3-mix, which runs on a smaller fleet here (the
full 2,048-host figures are quoted in docs/evaluation.md)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from fleetpulse import report
from fleetpulse.query import query
from fleetpulse.evaluate.plan import plan_from
from fleetpulse.evaluate.evaluation import Evaluation, Progress
from core.settings import CommonSettings, load
from tests.conftest import drop_database

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RUNS: list[str] = []  # the databases of this test's runs, dropped after it


@pytest.fixture(autouse=True)
def drop_runs(clickhouse_url):
    yield
    while RUNS:
        database = RUNS.pop()
        if not clickhouse_url.startswith("chdb://"):
            drop_database(clickhouse_url, database)


async def evaluate(name: str, *overrides: str, **options) -> dict:
    plan = plan_from(name, overrides, **options)
    r = await Evaluation(load(CommonSettings), plan, progress=Progress(every_s=15)).run()
    RUNS.append(r["database"])
    return r


def landed_in_full(report: dict) -> None:
    """Nothing lost, nothing doubled: every published record stored exactly once, nothing dead-lettered."""
    acc = report["accounting"]
    for name in ("samples_gpu_rows", "xid_lines", "nccl_timings", "agent_status", "net_ports", "host_lines", "truth"):
        assert acc[name]["stored"] == acc[name]["sent"], (name, acc[name])
    assert acc["dead_letters"] == {}


async def test_thermal_runaway_alerts_on_the_right_gpu_and_drains_nothing(settings_env):
    r = await evaluate("thermal-runaway")
    landed_in_full(r)
    k = r["fault_kinds"]["thermal_runaway"]
    assert (k["recall"], k["precision"]) == (1.0, 1.0), k
    assert k["latency_sim_s"]["p95"] <= 30, k
    assert r["drains"]["requested"] == 0
    assert len(r["alerts"]["firing"]) >= 4 and r["alerts"]["pages_by_name"] == {"GpuIncident": 1}, r["alerts"]


@pytest.mark.parametrize("slowdown", [10, 20])
async def test_straggler_flags_the_slow_rank_within_two_minutes_and_no_other(settings_env, slowdown):
    r = await evaluate("straggler", f"faults.0.slowdown_pct={slowdown}", "run.duration_s=300")  # onset at 120 s
    landed_in_full(r)
    s = r["stragglers"]
    assert s["flagged_expected"] == s["expected"] == 1, s
    assert s["flag_after_onset_s"]["max"] <= 120, s
    assert s["other_ranks_flagged"] == 0, s
    assert r["drains"]["requested"] == 0


async def test_congestion_slows_every_rank_alike_and_drains_nothing(settings_env):
    r = await evaluate("congestion", "run.nccl_interval_s=4")  # half the records; windows still hold 2-3 per rank
    landed_in_full(r)
    assert r["stragglers"]["other_ranks_flagged"] == 0, r["stragglers"]
    assert r["drains"]["requested"] == 0 and r["transitions"]["total"] == 0


async def test_llama3_mix_finds_hardware_faults_and_never_drains_for_software(settings_env):
    # 120 of the mix's faults on 256 hosts in 13 minutes: ~12x the full scenario's rate per host, so the breaker
    # cap is raised with it (the full run uses 15%).
    r = await evaluate("llama3-mix", "fleet.hosts=256", "generate.0.count=120", "generate.0.between=[30, 800]",
                       "run.duration_s=1000", 'pipeline.breaker={"max_share_pct": 40}')
    landed_in_full(r)
    hw = r["hardware"]
    assert hw["recall"] >= 0.95, hw
    assert r["drains"]["software_false_drain_rate"] <= 0.05, r["drains"]
    d = r["drains"]
    assert d["hardware_drained"] == d["hardware_expected"] > 0 and d["false"] == 0, d
    # Usable compute against a truth that keeps each drained host out for its repair cycle: the pipeline takes a
    # host out a tick after its fault and returns it after the bot's answers, so the two stay within 1.5 points.
    # Flat out, the error is timing noise of 15 one-minute buckets: 0.0003-0.0114 over 7 runs on 2026-12-03 (0.0034
    # and 0.0065 of them at 60f6422, before that session's changes), 0.0104 in a CI run; a point was too tight.
    assert r["usable_compute"]["mean_abs_error"] <= 0.015, r["usable_compute"]
    # wall-clock latency is a figure for docs/evaluation.md, not an assertion: this machine is shared

    # `fleetpulse report` over the run's database tells the same story from the store's views alone; over the run's
    # own minutes for usable compute (the store also holds the minutes after it, while the pipeline settles)
    store = load(CommonSettings, clickhouse_database=r["database"])
    out = report.build(store, None, None)
    assert out["drains"]["requested"] == d["requested"], (out["drains"], d)
    assert out["interruptions"]["total"] > 0 and out["drains"]["returned"] > 0, out
    window = [datetime.fromtimestamp(r["window"][k], timezone.utc) for k in ("start_ts", "end_ts")]
    minutes = report.build(store, *window)["usable_compute"]
    assert minutes["full_minutes_mean"] == pytest.approx(r["usable_compute"]["measured_mean"], abs=0.01), minutes


async def test_network_faults_are_found_from_ports_and_kernel_lines_and_only_lasting_ones_drain(settings_env):
    r = await evaluate("network")
    landed_in_full(r)
    assert r["accounting"]["net_ports"]["sent"] == 32 * 8 * 20 and r["accounting"]["host_lines"]["sent"] == 9
    for kind in ("link_flap", "link_down", "link_degraded", "nic_down", "ssd_error"):
        k = r["fault_kinds"][kind]
        assert (k["recall"], k["precision"]) == (1.0, 1.0), (kind, k)
    d = r["drains"]
    assert d["requested"] == d["true"] == d["hardware_expected"] == 5 and d["false"] == 0, d
    assert d["no_drain_faults"] == 2 and d["no_drain_drained"] == 0, d  # one drop, a 40 s outage: recorded only
    assert r["hardware"]["recall"] == 1.0, r["hardware"]


async def test_the_host_s_own_kernel_lines_drain_what_they_must_and_a_port_never_cabled_nothing(settings_env):
    """Machine checks, a filesystem that shut itself down and a cable's module error, each from real kernel lines,
    drain their host; 'Cable unplugged' at boot on a port that never had a cable drains nothing."""
    r = await evaluate("host-kernel")
    landed_in_full(r)
    assert r["accounting"]["host_lines"]["sent"] == 3 + 4 + 1 + 2
    for kind in ("machine_check", "fs_shutdown", "cable_error"):
        k = r["fault_kinds"][kind]
        assert (k["recall"], k["precision"]) == (1.0, 1.0), (kind, k)
    d = r["drains"]
    assert d["requested"] == d["true"] == d["hardware_expected"] == 3 and d["false"] == 0, d
    assert d["no_drain_faults"] == 2 and d["no_drain_drained"] == 0, d


async def test_faults_with_no_xid_drain_what_they_must_and_a_stalled_collector_or_a_power_saving_link_nothing(
        settings_env):
    """A corrected-ECC flood, PCIe links trained down (width; generation under load), a GPU's NVLink links gone and a
    Fabric Manager down, each seen only in the GPU's readings, drain their host; a stalled collector is
    MonitorBroken; an idle GPU's slower link, a host with nothing to compare its links with and a trickle of
    corrected errors drain nothing."""
    r = await evaluate("gpu-links")
    landed_in_full(r)
    for kind in ("ecc_flood", "pcie_downtrain", "nvlink_inactive", "fabric_down", "monitor_broken"):
        k = r["fault_kinds"][kind]
        assert (k["recall"], k["precision"]) == (1.0, 1.0), (kind, k)
    assert r["fault_kinds"]["fabric_down"]["drain"]["requested"] == 1  # 8 GPUs' faults: one host, one drain
    d = r["drains"]
    assert d["requested"] == d["true"] == d["hardware_expected"] == 5 and d["false"] == 0, d
    assert d["no_drain_faults"] == 4 and d["no_drain_drained"] == 0, d


async def test_a_fabric_manager_down_across_an_18_tray_domain_is_one_incident_not_18(settings_env):
    """gpu-domain: the 18 trays of one NVLink domain lose their fabric together: each drained, as one incident (one
    page, the breaker counting the domain once and never tripping, one repair of the domain's shared part); a lone
    tray's fabric in another domain drains by itself; every tray validates back and the page resolves."""
    r = await evaluate("gpu-domain")
    landed_in_full(r)
    k = r["fault_kinds"]["fabric_down"]
    assert (k["recall"], k["precision"], k["drain"]["requested"]) == (1.0, 1.0, 19), k
    d = r["drains"]
    assert d["requested"] == d["true"] == 19 and d["false"] == 0, d
    assert r["breaker"]["trips"] == 0, r["breaker"]
    assert r["alerts"]["pages_by_name"] == {"NvlinkDomainDown": 1}, r["alerts"]
    settings = load(CommonSettings, clickhouse_database=r["database"])
    pages = _rows(settings, "SELECT status, value, labels['domain'] AS domain FROM alerts "
                            "WHERE alertname = 'NvlinkDomainDown' ORDER BY ts")
    assert [p["status"] for p in pages] == ["firing", "resolved"] and float(pages[1]["value"]) == 18.0, pages
    drains = _rows(settings, "SELECT host, evidence['incident'] AS incident FROM drain_events WHERE action = 'drain'")
    joined = {row["host"] for row in drains if row["incident"] == pages[0]["domain"]}
    assert len(joined) == 17 and "gpu-node-0040" not in joined, drains  # the first tray's went out before its peers'
    # the 17 are repaired as one: the domain's shared part once, every tray's repair answered with it
    repairs = _rows(settings, "SELECT host, evidence['incident'] AS incident FROM drain_events WHERE action = 'repair'")
    assert {row["host"] for row in repairs if row["incident"] == pages[0]["domain"]} == joined, repairs
    assert r["remediation"]["domain_repairs"] == 1, r["remediation"]


async def test_gpus_whose_corrected_errors_climb_are_suspect_before_they_fail_and_drained_after_their_job(settings_env):
    """Three memory ramps: each GPU suspect (ecc_trend) before its failure, drained with mode after_jobs (its job's
    ranks not stopped) once its job reaches a checkpoint, no GPU with a steady trickle called suspect, no drain at
    once; what the jobs lost that way against draining at once."""
    r = await evaluate("gpu-gray")
    landed_in_full(r)
    k = r["fault_kinds"]["ecc_ramp"]
    assert (k["recall"], k["precision"], k["drain"]["requested"]) == (1.0, 1.0, 3), k
    d = r["drains"]
    assert d["requested"] == d["true"] == 3 and d["false"] == 0, d
    settings = load(CommonSettings, clickhouse_database=r["database"])
    drains = _rows(settings, "SELECT host, evidence['mode'] AS mode, evidence['cost.ranks_stopped'] AS stopped, "
                             "evidence['cost.summary'] AS summary FROM drain_events WHERE action = 'drain'")
    assert sorted(row["host"] for row in drains) == ["gpu-node-0002", "gpu-node-0005", "gpu-node-0011"]
    assert all(row["mode"] == "after_jobs" and row["stopped"] == "0" for row in drains), drains
    assert any(row["summary"].startswith("waits for job-0000") for row in drains), drains
    suspects = _rows(settings, "SELECT host, gpu_index FROM faults WHERE code = 'ecc_trend'")
    assert sorted((s["host"], s["gpu_index"]) for s in suspects) == [("gpu-node-0002", 3), ("gpu-node-0005", 0),
                                                                     ("gpu-node-0011", 6)]
    # job-0000 saves a checkpoint every hour from 0 s: both of its suspects reach one before they fail, and leave it
    # then (its restart lost, not its work); 0011 runs no job
    p = r["suspects"]
    assert (p["suspect_before_failure"], p["drained_before_failure"], p["failed_before_drain"], p["idle_hosts"]) == \
        (3, 2, 0, 1), p
    assert 0 < p["gpu_hours_lost"]["drain_when_idle"] < p["gpu_hours_lost"]["drain_at_once"], p


async def test_flapping_sensor_changes_node_state_at_most_once_per_dwell(settings_env):
    r = await evaluate("flapping")
    landed_in_full(r)
    assert r["transitions"]["max_health_changes_per_dwell"] <= 1, r["transitions"]
    assert r["fault_kinds"]["sensor_flap"]["recall"] == 1.0
    firing = r["alerts"]["firing"]
    assert firing.get("GpuTempSlowdown", 0) <= 2, firing  # flap damping: not one page per 3-minute cycle
    # One GPU, one incident: its conditions are its evidence. Flap damping lets a condition return once (above), and
    # when every condition was resolved at once the incident resolves and returns with them: 1 or 2 pages an hour.
    settings = load(CommonSettings, clickhouse_database=r["database"])
    assert r["alerts"]["pages"] <= 2, _rows(settings, "SELECT ts, host, alertname, status, starts_at, summary, labels "
                                                      "FROM alerts WHERE alertname NOT LIKE 'GpuT%' ORDER BY ts")


async def test_drain_storm_trips_the_breaker_and_drains_no_more_than_its_cap(settings_env):
    r = await evaluate("drain-storm")
    landed_in_full(r)
    b = r["breaker"]
    assert b["trips"] >= 1 and b["within_cap"], b
    assert 1 <= r["drains"]["requested"] <= b["cap"], (r["drains"], b)
    assert r["fault_kinds"]["xid119"]["recall"] == 1.0  # every fault found, only the drains held back


async def test_rack_over_budget_alerts_on_the_rack(settings_env):
    r = await evaluate("rack-over-budget")
    landed_in_full(r)
    k = r["fault_kinds"]["power_surge"]
    assert k["recall"] == 1.0 and k["precision"] == 1.0, k


async def test_killed_worker_resumes_node_states_and_loses_no_fault_event(settings_env):
    r = await evaluate("llama3-mix", "fleet.hosts=128", "generate.0.count=60", "generate.0.between=[30, 400]",
                       "run.duration_s=600", kill_worker_at=300)
    landed_in_full(r)
    assert r["pace"]["worker_restarts"] == 1
    assert r["transitions"]["chain_breaks"] == 0, r["transitions"]
    assert r["hardware"]["recall"] >= 0.95, r["hardware"]


async def test_demo_shows_alerts_a_drain_and_return_a_straggler_and_fills_every_grafana_panel(settings_env):
    """`fleetpulse up`'s default scenario: every part of the loop happens, and every panel of the Grafana dashboard
    as shipped (deploy/grafana), its macros expanded as the data source expands them, runs on the store and returns
    rows."""
    r = await evaluate("demo")
    landed_in_full(r)
    assert {"GpuTempSlowdown", "GpuHwThermalSlowdown"} <= set(r["alerts"]["firing"]), r["alerts"]
    d = r["drains"]
    assert d["requested"] == d["true"] == d["hardware_drained"] == 1 and d["false"] == 0, d
    s = r["stragglers"]
    assert s["flagged_expected"] == s["expected"] == 2 and s["other_ranks_flagged"] == 0, s
    settings = load(CommonSettings, clickhouse_database=r["database"])
    returned = _rows(settings, "SELECT count() AS n FROM node_episodes WHERE returned_at IS NOT NULL")
    assert returned == [{"n": "1"}] or returned == [{"n": 1}], returned

    from fleetpulse.grafana import files
    from fleetpulse.panels import expand

    shipped = json.loads((ROOT / "deploy/grafana/dashboards/fleetpulse-fleet.json").read_text())
    assert shipped == json.loads(files()["dashboards/fleetpulse-fleet.json"])
    span = _rows(settings, "SELECT toUnixTimestamp(min(ts)) AS lo, toUnixTimestamp(max(ts)) + 1 AS hi FROM gpu_samples")
    lo, hi = (datetime.fromtimestamp(int(span[0][k]), timezone.utc) for k in ("lo", "hi"))
    for panel in shipped["panels"]:
        sql = expand(panel["targets"][0]["rawSql"], lo, hi, 60)
        rows = _rows(settings, sql)
        assert rows, f"panel {panel['title']!r} returned no rows:\n{sql}"


async def test_a_repeat_offender_goes_to_replace_on_its_third_drain_and_stops_cycling(settings_env):
    r = await evaluate("repeat-offender")
    landed_in_full(r)
    assert r["drains"]["false"] == 0, r["drains"]
    settings = load(CommonSettings, clickhouse_database=r["database"])
    requests = _rows(settings, "SELECT action, evidence['repair'] AS repair, evidence['recurrence'] AS recurrence "
                               "FROM drain_events WHERE host = 'gpu-node-0001' ORDER BY ts LIMIT 1 BY event_id")
    actions = [q["action"] for q in requests]
    # Two cycles ending in a return each, then the third drain goes to replace and nothing follows it. A cycle may
    # hold an extra repair and validation: the health stage sometimes still shows the Xid's recovery action some
    # seconds after the simulated repair and fails the validation on it (about 1 run in 3, cause not found yet:
    # see the issue notes); the rule under test is the lifecycle's recurrence, which that does not change.
    assert actions.count("undrain") == 2 and actions[-2:] == ["drain", "replace"], requests
    assert [q["repair"] for q in requests if q["action"] == "drain"] == ["reset", "reset", "replace"]
    assert requests[-2]["recurrence"] == "3"
    start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (0, 4_000_000_000))
    offenders = report.build(settings, start, end)["repeat_after_repair"]["sent_to_replace"]
    assert [(o["host"], o["repair"], o["drains"]) for o in offenders] == [("gpu-node-0001", "reset", 3)]


def _rows(settings: CommonSettings, sql: str) -> list[dict]:
    return orjson.loads(query(settings, f"{sql}\nFORMAT JSON"))["data"]


async def test_host_silence_drains_the_dead_host_alerts_the_rack_once_and_leaves_maintenance_alone(settings_env):
    r = await evaluate("host-silence")
    landed_in_full(r)
    assert r["accounting"]["agent_status"]["stored"] == r["accounting"]["agent_status"]["sent"] > 0
    dead, rack = r["fault_kinds"]["host_down"], r["fault_kinds"]["rack_down"]
    assert (dead["recall"], dead["precision"], rack["recall"], rack["precision"]) == (1.0, 1.0, 1.0, 1.0), r
    d = r["drains"]
    assert (d["requested"], d["false"], d["hardware_expected"], d["hardware_drained"]) == (1, 0, 1, 1), d
    assert r["alerts"]["pages_by_name"] == {"RackSilent": 1}, r["alerts"]
    settings = load(CommonSettings, clickhouse_database=r["database"])
    faults = _rows(settings, "SELECT host, code, bin, reasons FROM faults WHERE code = 'host_silent'")
    assert [(f["host"], f["bin"]) for f in faults] == [("gpu-node-0003", "reboot")], faults
    assert "no goodbye" in faults[0]["reasons"][1]
    drains = _rows(settings, "SELECT DISTINCT host FROM drain_events WHERE action = 'drain'")
    assert drains == [{"host": "gpu-node-0003"}]  # not the maintained host, not the silent rack's
    [alert] = _rows(settings, "SELECT rack, labels['hosts'] AS hosts FROM alerts WHERE alertname = 'RackSilent' "
                              "AND status = 'firing'")
    assert alert["rack"] == "rack-003" and len(alert["hosts"].split(",")) == 8, alert


async def test_a_rack_back_from_a_power_loss_drains_only_the_host_that_stayed_dark(settings_env):
    """rack-power, at the worker's default wall-clock waits: 18 hosts back in one instant, read in several batches, are
    no host fault; the one whose power supply died is judged on its own after rejoin_s, and drained."""
    r = await evaluate("rack-power")
    landed_in_full(r)
    dead, rack = r["fault_kinds"]["host_down"], r["fault_kinds"]["rack_down"]
    assert (dead["recall"], dead["precision"], rack["recall"], rack["precision"]) == (1.0, 1.0, 1.0, 1.0), r
    d = r["drains"]
    assert (d["requested"], d["false"], d["hardware_expected"], d["hardware_drained"]) == (1, 0, 1, 1), d
    assert r["alerts"]["pages_by_name"] == {"RackSilent": 1}, r["alerts"]
    assert r["breaker"]["trips"] == 0, r["breaker"]
    settings = load(CommonSettings, clickhouse_database=r["database"])
    faults = _rows(settings, "SELECT host, toFloat64(ts) AS ts, evidence FROM faults WHERE code = 'host_silent'")
    assert [f["host"] for f in faults] == ["gpu-node-0020"], faults
    assert float(faults[0]["ts"]) - float(faults[0]["evidence"]["outage_ended_ts"]) >= 600, faults
    alerts = _rows(settings, "SELECT status, rack, value FROM alerts WHERE alertname = 'RackSilent' ORDER BY ts")
    assert [(a["status"], a["rack"]) for a in alerts] == [("firing", "rack-001"), ("resolved", "rack-001")], alerts
    assert float(alerts[0]["value"]) == 18.0, alerts


async def test_a_stalled_job_alerts_once_as_software_and_drains_nothing(settings_env):
    r = await evaluate("job-stall")
    landed_in_full(r)
    k = r["fault_kinds"]["job_crash"]
    assert (k["recall"], k["precision"]) == (1.0, 1.0), k
    assert r["alerts"]["pages_by_name"] == {"JobStalled": 1} and r["drains"]["requested"] == 0, r
    settings = load(CommonSettings, clickhouse_database=r["database"])
    [stall] = _rows(settings, "SELECT labels['job'] AS job, labels['cause'] AS cause FROM alerts "
                              "WHERE alertname = 'JobStalled' AND status = 'firing'")
    assert stall == {"job": "job-0001", "cause": "software"}
    assert _rows(settings, "SELECT count() AS n FROM faults")[0]["n"] in (0, "0")


async def test_an_agent_whose_nvml_fails_is_a_broken_monitor_not_a_drain(settings_env):
    r = await evaluate("broken-monitor")
    landed_in_full(r)
    settings = load(CommonSettings, clickhouse_database=r["database"])
    alerts = _rows(settings, "SELECT ts, host, status, starts_at, summary FROM alerts ORDER BY ts")
    k = r["fault_kinds"]["monitor_broken"]
    shown = "\n".join(map(str, [k, *alerts]))  # a str: pytest would cut the repr of a list short
    assert (k["recall"], k["precision"]) == (1.0, 1.0), shown
    assert r["alerts"]["pages_by_name"] == {"MonitorBroken": 1} and r["drains"]["requested"] == 0, shown
    assert _rows(settings, "SELECT count() AS n FROM faults WHERE code = 'host_silent'")[0]["n"] in (0, "0")
    failing = _rows(settings, "SELECT host, failing['nvml'] AS error FROM agent_status WHERE length(failing) > 0 "
                              "LIMIT 1")
    assert failing and failing[0]["host"] == "gpu-node-0002" and "NVML" in failing[0]["error"], failing
