"""Scoring against truth on hand-built rows: what counts as a detection, a false positive, a false drain."""

from __future__ import annotations

import pytest

from fleetpulse.evaluate import score

T0 = 1_700_000_000.0
RUN = score.Run(start_ts=T0, end_ts=T0 + 600, hosts=10, gpus=80, dwell_s=600, breaker_cap=3, breaker_window_s=900)


def truth(fid, kind, host, ts, *, gpu=None, expected=(), hardware=True, end=None, job=None, rank=None, rack="r0",
          allowed=()):
    return {"fault_id": fid, "kind": kind, "cause": "", "host": host, "rack": rack, "gpu_index": gpu, "job": job,
            "rank": rank, "ts": T0 + ts, "end_ts": None if end is None else T0 + end, "hardware": hardware,
            "expected": list(expected), "allowed": list(allowed), "kafka_ts": 5000.0 + ts}


def fault(host, gpu, code, ts, kafka_ts, bin_="reboot", decided=None):
    return {"fault_id": f"{host}/{gpu}/{code}/{ts}", "host": host, "gpu_index": gpu, "code": code, "bin": bin_,
            "first_ts": T0 + ts, "ts": T0 + (ts if decided is None else decided), "kafka_ts": kafka_ts}


def drain(host, ts, kafka_ts):
    return {"event_id": f"{host}:1:drain", "host": host, "action": "drain", "ts": T0 + ts, "kafka_ts": kafka_ts}


def test_xid_fault_and_drain_matched_with_latencies_and_a_false_positive_counted():
    t = [truth("f1", "xid79", "h1", 100, gpu=3, expected=["fault:xid:79", "bin:reboot", "drain"])]
    faults = [fault("h1", 3, "xid:79", 100, 5100.4), fault("h2", 0, "xid:79", 50, 5050.0)]  # h2: nothing injected
    sigs = score.signals(faults, [], [], [drain("h1", 100.2, 5100.9)])
    outcomes = score.match(t, sigs, RUN)
    kinds = score.per_kind(outcomes, sigs, {"f1": 5100.0})
    row = kinds["xid79"]
    assert (row["observable"], row["detected"], row["recall"]) == (1, 1, 1.0)
    assert row["precision"] == 0.5 and row["false_positives"] == 1
    assert row["latency_sim_s"]["p50"] == 0.0
    assert row["latency_wall_s"]["p50"] == pytest.approx(0.4)
    assert row["drain"]["requested"] == 1 and row["drain"]["latency_wall_s"]["p95"] == pytest.approx(0.9)
    assert score.drains(outcomes, sigs, t, RUN)["false"] == 0


def test_a_signal_on_another_gpu_or_outside_the_window_is_no_detection():
    t = [truth("f1", "ecc_dbe", "h1", 100, gpu=2, end=200, expected=["fault:ecc_dbe", "drain"])]
    faults = [fault("h1", 5, "ecc_dbe", 110, 1.0), fault("h1", 2, "ecc_dbe", 200 + 301, 2.0)]
    sigs = score.signals(faults, [], [], [])
    outcomes = score.match(t, sigs, RUN)
    assert outcomes[0].detected == {}
    row = score.per_kind(outcomes, sigs, {"f1": 0.0})["ecc_dbe"]
    assert row["recall"] == 0.0 and row["missed"] == ["f1"] and row["drain"]["recall"] == 0.0


def test_software_fault_drained_counts_as_false_drain_and_hardware_recall_excludes_invisible_causes():
    t = [truth("sw", "xid13", "h3", 10, gpu=0, expected=["fault:xid:13"], hardware=False),
         truth("psu", "host_down", "h4", 10, expected=[]),
         truth("hbm", "ecc_dbe", "h5", 10, gpu=1, expected=["fault:ecc_dbe", "drain"])]
    faults = [fault("h3", 0, "xid:13", 10, 1.0, "retry"), fault("h5", 1, "ecc_dbe", 11, 1.0, "reset")]
    sigs = score.signals(faults, [], [], [drain("h3", 12, 2.0), drain("h5", 11, 2.0)])
    outcomes = score.match(t, sigs, RUN)
    d = score.drains(outcomes, sigs, t, RUN)
    assert (d["true"], d["false"], d["false_hosts"]) == (1, 1, ["h3"])
    assert (d["software_faults"], d["software_drained"], d["software_false_drain_rate"]) == (1, 1, 1.0)
    hw = score.hardware_recall(outcomes)
    assert (hw["hardware_faults"], hw["attributable"], hw["detected"], hw["recall"]) == (2, 1, 1, 1.0)
    assert hw["not_visible_to_gpu_telemetry"] == {"host_down": 1}


def test_stragglers_match_by_job_and_rank_and_other_flagged_ranks_are_listed():
    t = [truth("s", "slow_rank", "h0", 120, gpu=5, job="job-0000", rank=517, expected=["straggler"])]
    flags = [{"job": "job-0000", "rank": 517, "host": "h0", "gpu_index": 5, "flagged": True, "ts": T0 + 215,
              "kafka_ts": 9.0},
             {"job": "job-0000", "rank": 517, "host": "h0", "gpu_index": 5, "flagged": True, "ts": T0 + 245,
              "kafka_ts": 9.5},
             {"job": "job-0000", "rank": 3, "host": "h9", "gpu_index": 3, "flagged": True, "ts": T0 + 300,
              "kafka_ts": 10.0}]
    sigs = score.signals([], [], flags, [])
    outcomes = score.match(t, sigs, RUN)
    s = score.stragglers(outcomes, sigs)
    assert s["flagged_expected"] == 1 and s["flag_after_onset_s"]["p50"] == 95.0
    assert s["other_ranks_flagged"] == 1 and s["other_ranks"] == ["job-0000#3"]


def test_rack_alert_matches_by_rack_and_thermal_alerts_by_gpu():
    t = [truth("r", "power_surge", "h0", 60, end=360, expected=["alert:rack_power"], rack="rack-000"),
         truth("th", "thermal_runaway", "h1", 30, gpu=3, end=120, expected=["alert:thermal"])]
    alerts = [{"alertname": "RackPowerOverBudget", "fingerprint": "a", "status": "firing", "host": "", "rack":
               "rack-000", "gpu_index": None, "starts_at": T0 + 75, "kafka_ts": 1.0},
              {"alertname": "GpuTempSlowdown", "fingerprint": "b", "status": "firing", "host": "h1", "rack": "r0",
               "gpu_index": 3, "starts_at": T0 + 50, "kafka_ts": 1.0},
              {"alertname": "GpuTempSlowdown", "fingerprint": "b", "status": "resolved", "host": "h1", "rack": "r0",
               "gpu_index": 3, "starts_at": T0 + 50, "kafka_ts": 2.0}]
    sigs = score.signals([], alerts, [], [])
    kinds = score.per_kind(score.match(t, sigs, RUN), sigs, {"r": 0.0, "th": 0.0})
    assert kinds["power_surge"]["recall"] == 1.0 and kinds["power_surge"]["latency_sim_s"]["p50"] == 15.0
    assert kinds["thermal_runaway"]["recall"] == 1.0 and kinds["thermal_runaway"]["precision"] == 1.0


def test_transitions_count_changes_per_dwell_and_chain_breaks():
    rows = [{"host": "h1", "state": s, "prev_state": p, "ts": T0 + ts, "kafka_partition": 0, "kafka_offset": i}
            for i, (s, p, ts) in enumerate([("suspect", "healthy", 100), ("healthy", "suspect", 800),
                                            ("suspect", "healthy", 1500), ("drain_requested", "healthy", 1600)])]
    got = score.transitions(rows, RUN)
    assert got["total"] == 4 and got["per_node_max"] == 4
    assert got["max_changes_per_dwell"] == 2  # 1500 and 1600 fall in one 600 s window
    assert got["max_health_changes_per_dwell"] == 1  # drain_requested is no health-driven change
    assert got["chain_breaks"] == 1 and "healthy after suspect" in got["chain_break_examples"][0]


def test_breaker_counts_trips_and_the_most_drains_in_a_window_against_the_cap():
    alerts = [{"alertname": "FleetDrainBreakerOpen", "fingerprint": "x", "status": "firing", "host": "", "rack": "",
               "gpu_index": None, "starts_at": T0 + 121, "kafka_ts": 1.0}]
    sigs = score.signals([], alerts, [], [drain(f"h{i}", 120 + i, 1.0) for i in range(3)] + [drain("h9", 2000, 2.0)])
    b = score.breaker(alerts, sigs, RUN)
    assert (b["trips"], b["max_drains_in_window"], b["cap"], b["within_cap"]) == (1, 3, 3, True)


def test_usable_compute_against_truth_counts_hosts_with_an_active_drain_worthy_hardware_fault():
    t = [truth("a", "gpu_lost", "h1", 0, gpu=0, end=300, expected=["drain"])]
    minutes = [{"minute_ts": T0 + 60 * m, "nodes": 10, "usable_compute": 0.9, "breakdown": {}} for m in range(10)]
    minutes[0]["nodes"] = 4  # not every node reported yet: counted, not scored
    got = score.usable_compute(minutes, t, RUN)
    assert (got["minutes"], got["minutes_partial"]) == (9, 1)
    # as at each minute's end: h1 is out at the ends of minutes 60-180, back at 300, the end of minute 240
    assert got["truth_mean"] == pytest.approx((3 * 0.9 + 6 * 1.0) / 9, abs=1e-4)
    assert got["mean_abs_error"] == pytest.approx(6 * 0.1 / 9, abs=1e-4)


def test_quantiles_of_nothing_are_none():
    assert score.quantiles([]) == {"n": 0, "p50": None, "p95": None, "max": None}


def test_alert_counts_by_status_and_name_and_the_pages_among_them():
    rows = [{"alertname": "A", "status": "firing", "condition": 1}, {"alertname": "A", "status": "resolved"},
            {"alertname": "GpuIncident", "status": "firing", "condition": 0},
            {"alertname": "GpuIncident", "status": "firing", "condition": 0},  # an escalation: paged again
            {"alertname": "B", "status": "firing", "condition": 1}, {"alertname": "A", "status": "firing"},
            {"alertname": "GpuIncident", "status": "resolved", "condition": 0}]
    assert score.alert_counts(rows, RUN) == {
        "firing": {"A": 2, "B": 1, "GpuIncident": 2}, "resolved": {"A": 1, "GpuIncident": 1},
        "pages": 3, "pages_by_name": {"A": 1, "GpuIncident": 2}, "pages_per_hour": 18.0}  # 3 in 10 minutes


def test_usable_compute_truth_keeps_a_drained_host_out_for_its_repair_cycle():
    """A reboot-bin fault that ends after 100 s still takes its host out for the bot's drain, reboot and validation;
    one that outlasts its cycle keeps it out to its end."""
    run = score.Run(start_ts=T0, end_ts=T0 + 600, hosts=10, gpus=80, out_s={"reboot": 250.0})
    minutes = [{"minute_ts": T0 + 60 * m, "nodes": 10, "usable_compute": 1.0, "breakdown": {}} for m in range(10)]
    short = [truth("a", "gpu_lost", "h1", 0, gpu=0, end=100, expected=["bin:reboot", "drain"])]
    assert score.usable_compute(minutes, short, run)["truth_mean"] == pytest.approx((4 * 0.9 + 6 * 1.0) / 10)
    long = [truth("a", "gpu_lost", "h1", 0, gpu=0, end=400, expected=["bin:reboot", "drain"])]
    assert score.usable_compute(minutes, long, run)["truth_mean"] == pytest.approx((6 * 0.9 + 4 * 1.0) / 10)


def alert(name, ts, *, host="", rack="", job=None, labels=None, status="firing", since=None):
    """An alert row decided at `ts` about something that began at `since` (default: then)."""
    row = {"alertname": name, "fingerprint": f"{name}/{host}/{rack}/{job}", "status": status, "host": host,
           "rack": rack, "gpu_index": None, "starts_at": T0 + (ts if since is None else since), "ts": T0 + ts,
           "kafka_ts": 1.0}
    if labels is not None:
        row["labels"] = labels
    if job is not None:
        row["job"] = job
    return row


def test_silence_signals_match_a_host_a_rack_or_a_job_and_extra_ones_are_false_positives():
    """The silence stage's outputs (streams/silence): host_silent faults and MonitorBroken by host, RackSilent by rack
    (one truth per host of the rack, all explained by the one alert), JobStalled by the job in its labels."""
    rack = [truth(f"r.{i}", "rack_down", f"k{i}", 400, end=700, expected=["alert:RackSilent"], rack="rack-003")
            for i in range(3)]
    t = [truth("crash", "host_down", "h3", 120, expected=["fault:host_silent", "bin:reboot", "drain"]),
         truth("nvml", "monitor_broken", "h2", 120, end=420, expected=["alert:MonitorBroken"], hardware=False),
         truth("hang", "job_crash", "h4", 120, end=420, job="job-0001", expected=["alert:JobStalled"],
               hardware=False),
         *rack]
    # dated from the last sign of life, before the fault began; matched and timed by when the stage decided
    faults = [fault("h3", None, "host_silent", 115, 2.0, decided=210),
              fault("k1", None, "host_silent", 395, 3.0, decided=520)]  # k1: a host of a silent rack
    alerts = [alert("RackSilent", 500, rack="rack-003", since=395), alert("RackSilent", 510, rack="rack-001"),
              alert("MonitorBroken", 200, host="h2"), alert("MonitorBroken", 200, host="h9"),
              alert("JobStalled", 240, labels={"job": "job-0001"}, since=110), alert("JobStalled", 250, job="job-0000")]
    sigs = score.signals(faults, alerts, [], [drain("h3", 211, 2.5)])
    outcomes = score.match(t, sigs, RUN)
    kinds = score.per_kind(outcomes, sigs, {o.truth["fault_id"]: 0.0 for o in outcomes})
    assert [(kinds[k]["recall"], kinds[k]["precision"]) for k in ("host_down", "monitor_broken", "job_crash",
                                                                   "rack_down")] == [(1.0, 0.5)] + [(1.0, 0.5)] * 3
    assert kinds["rack_down"]["injected"] == 3 and kinds["rack_down"]["latency_sim_s"]["p50"] == 100.0
    assert (kinds["host_down"]["latency_sim_s"]["p50"], kinds["job_crash"]["latency_sim_s"]["p50"]) == (90.0, 120.0)
    assert kinds["host_down"]["drain"] == {**kinds["host_down"]["drain"], "expected": 1, "requested": 1}
    by_id = {o.truth["fault_id"]: o for o in outcomes}
    assert by_id["hang"].detected["alert:JobStalled"].job == "job-0001"
    assert by_id["crash"].drain is not None and by_id["crash"].detected["fault:host_silent"].host == "h3"
    d = score.drains(outcomes, sigs, t, RUN)
    assert (d["hardware_expected"], d["hardware_drained"], d["true"], d["false"]) == (1, 1, 1, 0)


def test_a_drain_where_none_is_expected_is_false_and_counted_per_kind():
    """A rack's silence, an announced maintenance and a broken monitor expect no drain: one there is false."""
    t = [truth("r.0", "rack_down", "k0", 400, end=700, expected=["alert:RackSilent"], rack="rack-003"),
         truth("r.1", "rack_down", "k1", 400, end=700, expected=["alert:RackSilent"], rack="rack-003"),
         truth("m", "host_down", "h12", 180, end=480, expected=[], hardware=False),
         truth("crash", "host_down", "h3", 120, expected=["fault:host_silent", "bin:reboot", "drain"])]
    sigs = score.signals([], [], [], [drain("k1", 450, 1.0), drain("h12", 200, 1.0), drain("h3", 300, 1.0)])
    outcomes = score.match(t, sigs, RUN)
    d = score.drains(outcomes, sigs, t, RUN)
    assert (d["true"], d["false"], d["false_hosts"]) == (1, 2, ["h12", "k1"])
    assert (d["no_drain_faults"], d["no_drain_drained"], d["no_drain_drained_by_kind"]) == (
        3, 2, {"host_down": 1, "rack_down": 1})
    assert (d["software_faults"], d["software_drained"]) == (1, 1)  # the maintenance is no hardware fault
    assert (d["hardware_expected"], d["hardware_drained"]) == (1, 1)
    hw = score.hardware_recall(outcomes)
    assert (hw["hardware_faults"], hw["attributable"]) == (3, 3)  # a silent host is visible to the silence stage


def test_a_fleet_alert_matches_any_fault_and_a_rack_alert_needs_its_rack():
    t = [truth("a", "rack_down", "k0", 100, end=300, expected=["alert:RackSilent", "alert:FleetSilent"],
               rack="rack-000")]
    sigs = score.signals([], [alert("FleetSilent", 110), alert("RackSilent", 110, host="k0")], [], [])
    (o,) = score.match(t, sigs, RUN)
    assert set(o.detected) == {"alert:FleetSilent"}  # a rack alert without its rack matches no rack


def test_a_silent_host_is_out_of_usable_compute_until_its_reboot_cycle_ends():
    run = score.Run(start_ts=T0, end_ts=T0 + 600, hosts=10, gpus=80, out_s={"reboot": 250.0})
    minutes = [{"minute_ts": T0 + 60 * m, "nodes": 10, "usable_compute": 1.0, "breakdown": {}} for m in range(10)]
    down = [truth("a", "host_down", "h1", 0, expected=["fault:host_silent", "bin:reboot", "drain"]),
            truth("m", "host_down", "h2", 0, end=300, expected=[], hardware=False)]
    # h1 is out until its reboot cycle ends (the bot's repair brings a dead host back: FleetSimulator.repaired), 4 of
    # the 10 minutes as at their ends; the maintained h2 is never out (no drain expected)
    assert score.usable_compute(minutes, down, run)["truth_mean"] == pytest.approx((4 * 0.9 + 6 * 1.0) / 10)


def test_a_signal_a_band_allows_is_neither_found_nor_false():
    # A host down 120 s (between the silence rule's 60 s and truth's 150 s) and a slow rank of 4 % (between 3 and 5):
    # timing decides, so a drain or a flag is explained, and its absence is no miss.
    t = [truth("h", "host_down", "h1", 100, end=220, allowed=["fault:host_silent", "bin:reboot", "drain"]),
         truth("s", "slow_rank", "h0", 120, gpu=5, job="job-0000", rank=9, allowed=["straggler"])]
    flags = [{"job": "job-0000", "rank": 9, "host": "h0", "gpu_index": 5, "flagged": True, "ts": T0 + 215,
              "kafka_ts": 9.0}]
    sigs = score.signals([fault("h1", None, "host_silent", 180, 1.0)], [], flags, [drain("h1", 181, 2.0)])
    outcomes = score.match(t, sigs, RUN)
    assert score.drains(outcomes, sigs, t, RUN)["false"] == 0
    s = score.stragglers(outcomes, sigs)
    assert (s["expected"], s["flagged_expected"], s["other_ranks_flagged"]) == (0, 0, 0)
    assert all(o.detected == {} and o.drain is None for o in outcomes)
    assert score.per_kind(outcomes, sigs, {})["host_down"]["observable"] == 0


class _Job:
    """A job of `gpus` GPUs checkpointing every 1,000 s of the run from 0 (agents/simulator/fleet.Job's interface)."""

    def __init__(self, gpus):
        self.world_size = gpus

    @staticmethod
    def checkpoint_before(t):
        return (t // 1000) * 1000.0

    @staticmethod
    def checkpoint_after(t):
        return -(-t // 1000) * 1000.0


RAMP = ["fault:ecc_trend", "bin:inspect", "drain"]


def ramp(fid, host, ts, *, suspect_after, lead, job="job-0"):
    t = truth(fid, "ecc_ramp", host, ts, gpu=1, expected=RAMP, job=job)
    return {**t, "params": {"suspect_after_s": float(suspect_after), "lead_s": float(lead)}}


def test_a_ramp_the_run_ends_before_it_could_be_suspect_expects_no_suspect():
    run = score.Run(start_ts=T0, end_ts=T0 + 3000, hosts=10, gpus=80)
    early, late = ramp("a", "h1", 100, suspect_after=1000, lead=3600), ramp("b", "h2", 100, suspect_after=2500, lead=3600)
    kept, cut = score.seen_by_end([early, late], run)
    assert kept["expected"] == RAMP
    assert cut["expected"] == [] and set(RAMP) <= set(cut["allowed"])


def test_suspect_policies_count_what_jobs_lose_drained_at_a_checkpoint_against_drained_at_once():
    """h1's GPU is suspect at 1,500 s and fails at 2,600 s: its job reaches a checkpoint at 2,000 s and leaves the
    node then (64 GPUs lose the 600 s restart), where draining at once would have lost the restart and the 500 s since
    the 1,000 s checkpoint. h2's is suspect at 2,100 s and fails at 2,900 s, before its job's 3,000 s checkpoint: the
    failure crashes the job (restart and 900 s since 2,000 s), against 100 s since the checkpoint at once. h3's never
    became suspect: a crash either way. h4 runs no job; h5 fails after the run."""
    run = score.Run(start_ts=T0, end_ts=T0 + 3500, hosts=10, gpus=80, jobs={"job-0": _Job(64)})
    t = [ramp("a", "h1", 0, suspect_after=1500, lead=2600), ramp("b", "h2", 0, suspect_after=2100, lead=2900),
         ramp("c", "h3", 0, suspect_after=2900, lead=3100), ramp("d", "h4", 0, suspect_after=1500, lead=2600, job=None),
         ramp("e", "h5", 1000, suspect_after=2000, lead=4000)]
    sigs = score.signals([fault("h1", 1, "ecc_trend", 1500, 1.0, "inspect"), fault("h2", 1, "ecc_trend", 2100, 1.0,
                                                                                 "inspect"),
                          fault("h4", 1, "ecc_trend", 1500, 1.0, "inspect"), fault("h5", 1, "ecc_trend", 3000, 1.0,
                                                                                   "inspect")], [], [], [])
    states = [{"host": "h1", "state": "drained", "ts": T0 + 2060}, {"host": "h2", "state": "drained", "ts": T0 + 2960},
              {"host": "h4", "state": "drained", "ts": T0 + 1560}]
    p = score.suspect_policies(t, sigs, states, run, restart_s=600)
    assert (p["ramps"], p["suspect_before_failure"], p["idle_hosts"], p["undecided_at_end"]) == (5, 4, 1, 1)
    assert (p["drained_before_failure"], p["failed_before_drain"]) == (1, 2)
    h = 64 / 3600
    idle = h * 600 + h * (600 + 900) + h * (600 + 100)
    once = h * (600 + 500) + h * (600 + 100) + h * (600 + 100)
    assert p["gpu_hours_lost"] == {"drain_when_idle": round(idle, 1), "drain_at_once": round(once, 1)}
    assert p["lead_min"]["n"] == 4 and p["lead_min"]["max"] == pytest.approx(2000 / 60, abs=0.1)  # h5


def test_usable_compute_truth_takes_a_suspect_out_when_its_job_reaches_a_checkpoint():
    """A ramp suspect at 1,500 s on a job that checkpoints at 2,000 s is out from 2,060 s (the drain after it); one
    that fails first is out at its failure."""
    run = score.Run(start_ts=T0, end_ts=T0 + 3600, hosts=10, gpus=80, out_s={"inspect": 1000.0}, drain_s=60.0,
                    jobs={"job-0": _Job(64)})
    assert score._out_at(ramp("a", "h1", 0, suspect_after=1500, lead=2600), run) == T0 + 2060
    assert score._back_at(ramp("a", "h1", 0, suspect_after=1500, lead=2600), run) == T0 + 3000
    assert score._out_at(ramp("b", "h1", 0, suspect_after=1500, lead=1900), run) == T0 + 1900
    assert score._out_at(ramp("c", "h1", 0, suspect_after=1500, lead=2600, job=None), run) == T0 + 1560
