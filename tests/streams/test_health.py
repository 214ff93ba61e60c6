"""Health core: every hard gate, every weighted penalty, node aggregation, software faults, and what gets emitted."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.health.rules import (COLS, HealthConfig, HostHealth, Scores, apply_fault, apply_remediation, apply_sample,
                                  apply_straggler, gates, row_gates, score, score_all)
from streams.health.stage import news
from tests.streams.helpers import gpu, sample

CFG = HealthConfig()
T0 = 10_000.0


class Rows:
    """A host's Scores with every row built, as tests read them."""

    def __init__(self, sc: Scores):
        self.raw, self.node, self.gpus = sc, sc.node(), [sc.gpu(i) for i in range(len(sc.gpu_gates))]


def scored(h: HostHealth, now: float) -> Rows:
    return Rows(score(h, "h1", now, CFG))


def feed(h: HostHealth, n: int, *, t0: float = T0, step: float = 10.0, gpus: int = 8, host: str = "h1",
         **per_gpu) -> Rows:
    """n samples every `step` s; per_gpu maps a GPU index to a function (i, t) -> reading overrides."""
    for k in range(n):
        t = t0 + k * step
        rows = [gpu(i, 60.0, **(per_gpu.get(f"g{i}", lambda k, t: {})(k, t))) for i in range(gpus)]
        apply_sample(h, sample(host, t, rows, seq=k), CFG)
    return Rows(score(h, host, h.wm, CFG))


def fault(fid: str, ts: float, bin_: str, gpu_index: int | None = 1, code: str = "xid:79", count: int = 1) -> dict:
    return {"fault_id": fid, "ts": ts, "host": "h1", "gpu_index": gpu_index, "code": code, "bin": bin_,
            "rule": "catalog", "count": count, "first_ts": ts, "last_ts": ts, "evidence": {}}


def test_a_healthy_host_scores_100_with_no_gates_or_penalties():
    sc = feed(HostHealth(), 5)
    assert (sc.node.score, sc.node.schedulable, sc.node.gates, sc.node.penalties) == (100.0, True, [], [])
    assert [g.score for g in sc.gpus] == [100.0] * 8
    assert sc.node.inputs["installed_gpus"] == 8 and sc.node.inputs["present_gpus"] == 8


def test_new_double_bit_error_gates_until_a_repair():
    h = HostHealth()
    feed(h, 3, g2=lambda k, t: {"ecc_dbe_volatile": 0, "ecc_dbe_aggregate": 4})  # old aggregate DBEs: no gate
    assert scored(h, h.wm).node.gates == []
    sc = feed(h, 3, t0=T0 + 100, g2=lambda k, t: {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 5})
    assert sc.node.gates == ["gpu2/ecc_dbe"] and not sc.node.schedulable
    assert sc.node.score <= CFG.gate_cap and sc.gpus[2].gates == ["ecc_dbe"] and sc.gpus[3].schedulable
    assert sc.node.inputs["gate_since.gpu2/ecc_dbe"] == T0 + 100  # the onset, not the latest sample
    apply_remediation(h, {"ok": True, "action": "repair", "ts": T0 + 200})
    sc = feed(h, 2, t0=T0 + 210, g2=lambda k, t: {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 5})
    assert sc.node.gates == [] and sc.node.score == 100.0


@pytest.mark.parametrize("fields, gate", [
    ({"row_remap_pending": True}, "row_remap_pending"),
    ({"row_remap_failure": True}, "row_remap_failure"),
    ({"retired_pages_pending": True}, "retired_pages_pending"),
    ({"recovery_action": 2}, "recovery_action:node_reboot"),
    ({"recovery_action": 1}, "recovery_action:gpu_reset"),
])
def test_state_gates_hold_while_the_condition_holds(fields, gate):
    h = HostHealth()
    sc = feed(h, 3, g5=lambda k, t: fields)
    assert sc.node.gates == [f"gpu5/{gate}"] and sc.node.score == CFG.gate_cap
    assert sc.node.inputs[f"gate_since.gpu5/{gate}"] == T0  # first seen, kept while it holds
    clear = {k: (False if isinstance(v, bool) else 0) for k, v in fields.items()}
    assert feed(h, 1, t0=T0 + 100, g5=lambda k, t: clear).node.gates == []


def test_recovery_action_none_or_unknown_is_no_gate():
    assert feed(HostHealth(), 2, g0=lambda k, t: {"recovery_action": 0}, g1=lambda k, t: {"recovery_action": None}) \
        .node.gates == []


def test_a_gpu_missing_from_its_hosts_sample_is_lost():
    h = HostHealth()
    feed(h, 2)
    sc = feed(h, 1, t0=T0 + 60, gpus=7)  # GPU 7 is gone
    assert sc.node.gates == ["gpu7/gpu_lost"] and sc.node.inputs["present_gpus"] == 7
    assert sc.gpus[7].gates == ["gpu_lost"] and sc.gpus[7].score == CFG.gate_cap and not sc.gpus[7].schedulable
    assert feed(h, 1, t0=T0 + 120).node.gates == []  # back after a reboot


def test_a_sample_with_no_gpus_loses_every_installed_one():
    """A valid sample (gpus may be empty: the driver sees none) is scored, not refused by the rules: the hostile corpus
    found health raising on it (max() of no GPU indices) and dead-lettering a record the sink stored."""
    h = HostHealth()
    feed(h, 2)
    sc = feed(h, 1, t0=T0 + 60, gpus=0)
    assert sc.node.inputs["present_gpus"] == 0 and sc.node.gates == [f"gpu{i}/gpu_lost" for i in range(8)]
    assert feed(h, 1, t0=T0 + 120).node.gates == []  # back after a reboot
    fresh = HostHealth()
    apply_sample(fresh, sample("h1", T0, [], seq=0), CFG)  # never a GPU: nothing installed, nothing to score
    assert fresh.installed == 0 and fresh.present == []


def test_fault_bins_gate_by_bin_and_software_bins_do_not():
    h = HostHealth()
    feed(h, 1)
    for i, b in enumerate(("ignore", "retry")):
        apply_fault(h, fault(f"f{i}", T0 + 5, b, code="xid:13"), CFG)
    sc = scored(h, T0 + 10)
    assert sc.node.gates == [] and sc.node.score > 95
    apply_fault(h, fault("f3", T0 + 20, "reboot", gpu_index=1), CFG)
    apply_fault(h, fault("f4", T0 + 21, "inspect", gpu_index=None, code="sxid:12028"), CFG)
    sc = scored(h, T0 + 30)
    assert sc.node.gates == ["fault_bin:inspect", "gpu1/fault_bin:reboot"] and sc.node.score <= CFG.gate_cap
    assert sc.node.inputs["gate_since.gpu1/fault_bin:reboot"] == T0 + 20
    assert scored(h, T0 + 21 + CFG.fault_gate_max_s + 1).node.gates == []  # unrepaired: stops gating


def test_a_repair_ends_fault_gates_and_a_later_fault_gates_again():
    h = HostHealth()
    feed(h, 1)
    apply_fault(h, fault("f1", T0 + 5, "reset"), CFG)
    assert apply_remediation(h, {"ok": True, "action": "repair", "ts": T0 + 50})
    assert not apply_remediation(h, {"ok": False, "action": "repair", "ts": T0 + 60})
    assert scored(h, T0 + 60).node.gates == []
    apply_fault(h, fault("f2", T0 + 70, "reset"), CFG)
    assert scored(h, T0 + 80).node.inputs["gate_since.gpu1/fault_bin:reset"] == T0 + 70


def test_storm_summary_updates_its_fault_and_a_replay_changes_nothing():
    h = HostHealth()
    assert apply_fault(h, fault("f1", T0, "retry"), CFG)
    assert not apply_fault(h, fault("f1", T0, "retry"), CFG)
    assert apply_fault(h, {**fault("f1", T0, "retry"), "last_ts": T0 + 200, "count": 40}, CFG)
    assert len(h.faults) == 1 and h.faults[0][2] == T0 + 200 and h.faults[0][6] == 40


def test_thermal_headroom_is_against_each_gpus_own_slowdown_limit():
    sc = feed(HostHealth(), 2, g0=lambda k, t: {"gpu_temp_c": 84.0},  # 5 C under 89: half of 10 C margin
              g1=lambda k, t: {"gpu_temp_c": 84.0, "slowdown_temp_c": 94.0})  # 10 C under its own 94: none
    [p] = sc.gpus[0].penalties
    assert (p.name, p.value, p.points) == ("thermal_headroom", 5.0, CFG.weights['thermal_headroom'] / 2)
    assert "89 C slowdown limit" in p.reason and sc.gpus[1].penalties == []


def test_hbm_near_its_max_operating_temperature_costs_thermal_points():
    sc = feed(HostHealth(), 2, g0=lambda k, t: {"hbm_temp_c": 94.0})  # 1 C under 95: 80% of a 5 C margin
    assert sc.gpus[0].penalties[0].points == pytest.approx(0.8 * CFG.weights['thermal_headroom'])


def test_throttle_share_builds_over_its_window_and_power_cap_counts_half():
    hot, capped = {"throttle_reasons": 0x40}, {"throttle_reasons": 0x4}
    sc = feed(HostHealth(), 31, g0=lambda k, t: hot, g1=lambda k, t: capped)  # 300 s = one tau
    share0, share1 = sc.gpus[0].inputs["throttle_share"], sc.gpus[1].inputs["throttle_share"]
    assert share0 == pytest.approx(1 - 2.718281828 ** -1, abs=0.01)  # EWMA after one time constant
    assert share1 == pytest.approx(share0 / 2, abs=0.01)
    assert sc.gpus[0].penalties[0].points == pytest.approx(CFG.weights['throttle_share'])  # over the 0.5 full share
    assert 0 < sc.node.inputs["throttle_loss_gpus"] < 1


@pytest.mark.parametrize("field, per_step, name, value, points", [
    ("pcie_replay_count", 4, "pcie_replay_rate", 24.0, 10.0),  # 4 per 10 s = 24/min, over the 8/min full scale
    ("pcie_replay_count", 0.5, "pcie_replay_rate", 3.0, 3.75),
    ("nvlink_crc_errors", 50, "nvlink_error_rate", 5.0, 5.0),  # 5/s of a 10/s full scale
    ("ecc_sbe_volatile", 1, "ecc_sbe_rate", 360.0, 6.4),  # 360/h on a log scale to 10,000/h
])
def test_counter_rates_become_penalties(field, per_step, name, value, points):
    sc = feed(HostHealth(), 200, g3=lambda k, t: {field: int(k * per_step)})  # ~7 time constants: settled
    [p] = sc.gpus[3].penalties
    assert p.name == name and p.value == pytest.approx(value, rel=0.05) and p.points == pytest.approx(points, abs=0.3)


def test_a_counter_reset_is_a_new_baseline_not_a_negative_rate():
    h = HostHealth()
    feed(h, 10, g0=lambda k, t: {"pcie_replay_count": 1000})
    sc = feed(h, 10, t0=T0 + 200, g0=lambda k, t: {"pcie_replay_count": 0})
    assert sc.gpus[0].inputs["pcie_replay_rate"] == 0.0


def test_nvlink_recoveries_weigh_a_hundred_crc_errors():
    sc = feed(HostHealth(), 200, g4=lambda k, t: {"nvlink_recovery_errors": k // 10})  # one recovery per 100 s
    assert sc.gpus[4].inputs["nvlink_error_rate"] == pytest.approx(1.0, rel=0.2)  # a bursty series: EWMA ripple


def test_straggler_penalty_only_while_flagged_and_fresh():
    h = HostHealth()
    feed(h, 1)
    apply_straggler(h, {"host": "h1", "gpu_index": 6, "ts": T0, "flagged": True, "slowdown_pct": 10.0, "z": 9.0})
    sc = scored(h, T0 + 10)
    [p] = sc.gpus[6].penalties
    assert (p.name, p.points) == ("straggler_slowdown", CFG.weights['straggler_slowdown'] / 2)
    assert sc.node.inputs["straggler_loss_gpus"] == pytest.approx(10 / 110, abs=1e-3)
    assert scored(h, T0 + CFG.straggler_ttl_s + 1).gpus[6].penalties == []  # not refreshed: stale
    apply_straggler(h, {"host": "h1", "gpu_index": 6, "ts": T0 + 60, "flagged": False, "slowdown_pct": 1.0, "z": 1.0})
    assert h.stragglers == {}


def test_fault_history_decays_and_software_faults_are_capped():
    h = HostHealth()
    feed(h, 1)
    for i in range(40):  # a crash-looping job: 40 Xid 13 events on one GPU
        apply_fault(h, fault(f"x{i}", T0 - 3600 + i * 60, "retry", gpu_index=0, code="xid:13"), CFG)
    sc = scored(h, T0)
    assert sc.gpus[0].penalties[0].points == CFG.software_cap and sc.node.score == 100 - CFG.software_cap
    apply_fault(h, fault("r1", T0 - 6 * 3600, "reboot", gpu_index=2), CFG)  # one half-life old, long repaired
    apply_remediation(h, {"ok": True, "action": "repair", "ts": T0 - 5 * 3600})
    assert scored(h, T0).gpus[2].penalties[0].points == pytest.approx(CFG.bin_points["reboot"] / 2)


def test_software_only_faults_on_every_gpu_and_the_node_can_never_reach_suspect():
    h = HostHealth()
    feed(h, 1)
    for i in range(500):
        apply_fault(h, fault(f"s{i}", T0 - i, "retry", gpu_index=None if i % 9 == 8 else i % 9, code="xid:31"), CFG)
    assert scored(h, T0).node.score >= 100 - 2 * CFG.software_cap > 60


def test_node_takes_its_worst_gpu_less_node_level_penalties_with_reasons():
    h = HostHealth()
    feed(h, 2, g1=lambda k, t: {"gpu_temp_c": 84.0}, g4=lambda k, t: {"gpu_temp_c": 87.0})
    apply_straggler(h, {"host": "h1", "gpu_index": None, "ts": h.wm, "flagged": True, "slowdown_pct": 4.0, "z": 5})
    sc = scored(h, h.wm)
    assert sc.gpus[4].score == 100 - 0.8 * CFG.weights['thermal_headroom'] and sc.node.inputs["worst_gpu"] == 4
    assert [p.name for p in sc.node.penalties] == ["gpu4.thermal_headroom", "straggler_slowdown"]
    assert sc.node.score == pytest.approx(sc.gpus[4].score - CFG.weights['straggler_slowdown'] * 4 / 20)


def test_emission_on_change_hysteresis_and_heartbeat():
    h = HostHealth()
    first = news(h, feed(h, 1).raw, CFG)
    assert len(first) == 9 and first[-1].gpu_index is None  # every GPU once, then the node
    assert news(h, feed(h, 1, t0=T0 + 10, g0=lambda k, t: {"gpu_temp_c": 79.5}).raw, CFG) == []  # 0.5 points: quiet
    moved = news(h, feed(h, 1, t0=T0 + 20, g0=lambda k, t: {"gpu_temp_c": 81.0}).raw, CFG)
    assert [(r.gpu_index, r.score) for r in moved] == [(0, 95.0), (None, 95.0)]  # 8 C headroom: 5 points
    gate = news(h, feed(h, 1, t0=T0 + 30, g0=lambda k, t: {"gpu_temp_c": 81.0, "row_remap_pending": True}).raw,
                CFG)
    assert [(r.gpu_index, r.gates) for r in gate] == [(0, ["row_remap_pending"]), (None, ["gpu0/row_remap_pending"])]
    still = {"gpu_temp_c": 81.0, "row_remap_pending": True}
    beat = news(h, feed(h, 1, t0=T0 + 30 + CFG.heartbeat_s, g0=lambda k, t: still).raw, CFG)
    assert [r.gpu_index for r in beat] == [0, None]  # the node, and its GPUs below 100


def test_a_suspect_s_fault_lowers_the_score_but_never_gates_the_node():
    """A fault asking for a drain after the job (a GPU whose corrected errors climb) is the lifecycle's to time: a
    gate would make it a drain at once."""
    h = HostHealth()
    feed(h, 2)
    suspect = {**fault("s1", T0 + 15, "inspect", gpu_index=3, code="ecc_trend"), "evidence": {"mode": "after_jobs"}}
    apply_fault(h, suspect, CFG)
    sc = scored(h, T0 + 20)
    assert sc.node.gates == [] and sc.node.schedulable
    assert sc.gpus[3].score == pytest.approx(100 - CFG.weights["fault_history"] * 8 / 20, abs=0.1)
    apply_fault(h, fault("d1", T0 + 30, "reset", gpu_index=3, code="ecc_dbe"), CFG)  # then it fails: a gate
    assert scored(h, T0 + 31).node.gates == ["gpu3/fault_bin:reset"]


def test_the_node_row_names_the_host_s_job_and_a_new_job_is_news_at_once():
    h = HostHealth()
    rows = [gpu(i) for i in range(8)]
    apply_sample(h, {**sample("h1", T0, rows), "job": "job-3"}, CFG)
    first = news(h, score(h, "h1", h.wm, CFG), CFG)
    assert first[-1].gpu_index is None and first[-1].job == "job-3"
    apply_sample(h, {**sample("h1", T0 + 10, rows, seq=1), "job": "job-3"}, CFG)
    [sc] = score_all([(h, "h1", h.wm)], CFG, skip_quiet=True)
    assert sc is None  # the same job, nothing moved: quiet
    apply_sample(h, {**sample("h1", T0 + 20, rows, seq=2), "job": None}, CFG)  # the job ended
    [sc] = score_all([(h, "h1", h.wm)], CFG, skip_quiet=True)
    assert [(r.gpu_index, r.job) for r in news(h, sc, CFG)] == [(None, None)]
    assert HostHealth.from_json(orjson.loads(orjson.dumps(h.to_json()))) == h


def test_state_survives_the_changelog_and_replays_are_ignored():
    h = HostHealth()
    feed(h, 5, g2=lambda k, t: {"pcie_replay_count": 3 * k, "throttle_reasons": 0x8})
    apply_fault(h, fault("f1", T0, "reboot"), CFG)
    back = HostHealth.from_json(orjson.loads(orjson.dumps(h.to_json())))
    assert orjson.dumps(back.to_json()) == orjson.dumps(h.to_json())  # NaN (unknown) in memory, null on the wire
    assert not apply_sample(back, sample("h1", T0, [gpu(i) for i in range(8)]), CFG)  # older than the watermark
    assert score(back, "h1", back.wm, CFG).node() == score(h, "h1", h.wm, CFG).node()


_VALUES = st.sampled_from([math.nan, 0.0, 1.0, 2.0, 5.0, T0 - 50_000.0, T0 - 100.0, T0, T0 + 5.0])


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.lists(_VALUES, min_size=len(COLS), max_size=len(COLS)), min_size=1, max_size=8),
       present=st.sets(st.integers(0, 7)), repaired_at=st.sampled_from([0.0, T0 - 200.0, T0 + 1.0]),
       now=st.sampled_from([T0, T0 + 30_000.0]))
def test_the_vectorised_row_test_finds_a_gate_exactly_where_gates_does(rows, present, repaired_at, now):
    """row_gates() lets gates() skip a host's rows; a host it calls quiet must have no gate in them."""
    h = HostHealth(installed=len(rows), present=sorted(i for i in present if i < len(rows)),
                   rows=np.array(rows, dtype=float), repaired_at=repaired_at)
    full = gates(HostHealth(**{**h.__dict__, "since": {}}), now, CFG)
    hits = row_gates(np.array(rows, dtype=float), np.full(len(rows), repaired_at), np.full(len(rows), now), CFG)
    row_keys = {k for k in full if not k.endswith("/gpu_lost")}
    assert bool(row_keys) == any(hit for i, hit in enumerate(hits) if i in h.present)
    quiet = not any(hits)
    assert gates(h, now, CFG, rows_quiet=quiet) == full


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(60.0, 90.0), st.booleans(), st.floats(1.0, 90.0)),
                min_size=1, max_size=25))
def test_skipping_quiet_hosts_publishes_exactly_what_news_would(steps):
    """score_all(skip_quiet=True) leaves out only hosts whose news() is empty: the same rows go out either way."""
    skipping, reference, t = HostHealth(), HostHealth(), T0
    for g, temp, pending, gap in steps:  # GPU g moves to temp (maybe with a pending remap) after `gap` seconds
        t += gap
        rows = [gpu(i, temp if i == g else 60.0, row_remap_pending=pending and i == g) for i in range(4)]
        for h in (skipping, reference):
            apply_sample(h, sample("h1", t, rows), CFG)
        [sc] = score_all([(skipping, "h1", t)], CFG, skip_quiet=True)
        got = [] if sc is None else news(skipping, sc, CFG)
        assert got == news(reference, score(reference, "h1", t, CFG), CFG)
        assert skipping == reference
