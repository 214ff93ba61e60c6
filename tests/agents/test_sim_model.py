"""The simulator's pure model: strict schema validity, correlated physics, counters and determinism."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from agents.simulator import FleetSimulator, build_tick
from agents.simulator.fleet import GPUS_PER_HOST, HGX_PCI_BUSES, build_fleet
from agents.simulator.gpu_state import GPU_IDLE
from schemas.analytics import InjectedFault
from schemas.events import NcclStep, NcclTiming, XidEvent
from schemas.telemetry import HostSample

TS0 = 1_700_000_000.0


def run(sim: FleetSimulator, ticks: int):
    return [sim.step() for _ in range(ticks)]


def gpu(sample: dict, index: int) -> dict:
    (reading,) = [g for g in sample["gpus"] if g["index"] == index]
    return reading


def test_every_record_validates_strictly_against_the_schemas():
    sim = FleetSimulator(6, seed=3, scenario="fault-mix", start_ts=TS0)
    kinds = set()
    for tick in run(sim, 170):
        for s in tick.samples:
            HostSample.model_validate(s, strict=True)
        for e in tick.xid:
            XidEvent.model_validate(e, strict=True)
        for r in tick.nccl:
            NcclStep.model_validate(r, strict=True)
        for r in tick.timings:
            NcclTiming.model_validate(r, strict=True)
        for t in tick.truth:
            kinds.add(InjectedFault.model_validate(t, strict=True).kind)
    assert kinds == {"xid13", "power_cap", "ecc_dbe", "nvlink_crc", "row_remap_failure", "gpu_lost"}


def test_one_sample_per_host_per_tick_with_layout_of_an_hgx_fleet():
    sim = FleetSimulator(40, seed=1, start_ts=TS0, interval=2.0)
    ticks = run(sim, 3)
    for k, tick in enumerate(ticks):
        assert [s["host"] for s in tick.samples] == [f"gpu-node-{i:04d}" for i in range(40)]
        assert {s["seq"] for s in tick.samples} == {k}
        assert {s["ts"] for s in tick.samples} == {TS0 + 2.0 * k}
    first = ticks[0].samples
    assert first[17]["rack"] == "rack-001"
    assert [g["pci_bus_id"] for g in first[0]["gpus"]] == [f"0000:{b:02x}:00.0" for b in HGX_PCI_BUSES]
    uuids = [g["uuid"] for s in first for g in s["gpus"]]
    assert len(set(uuids)) == 40 * GPUS_PER_HOST and all(u.startswith("GPU-") and len(u) == 40 for u in uuids)
    assert uuids == [g["uuid"] for s in build_tick(40, seed=99).samples for g in s["gpus"]]  # stable across seeds
    fleet = sim.fleet
    assert all(len(j.hosts) in (8, 16, 32, 64) for j in fleet.jobs[:-1])  # the last takes what is left
    assert sum(len(j.hosts) for j in fleet.jobs) == 38
    assert [h for j in fleet.jobs for h in j.hosts] == list(range(38))
    assert (fleet.host_job < 0).sum() == round(40 * 0.06)


def test_power_follows_utilisation_and_idle_gpus_report_idle():
    sim = FleetSimulator(2, seed=0, start_ts=TS0)
    sim.state.util_level[:8] = np.linspace(10.0, 100.0, 8)
    sim.state.util_noise[:] = 0.0
    gpus = run(sim, 30)[-1].samples[0]["gpus"]
    power = [g["power_w"] for g in gpus]
    temps = [g["gpu_temp_c"] for g in gpus]
    assert power == sorted(power) and power[-1] - power[0] > 300
    assert np.corrcoef([g["gpu_util_pct"] for g in gpus], power)[0, 1] > 0.98
    assert temps[-1] - temps[0] > 15  # hotter where more power flows
    idle = FleetSimulator(40, seed=0, start_ts=TS0)  # hosts 37..39 run no job
    sample = run(idle, 2)[-1].samples[39]
    assert sample["job"] is None
    assert all(g["gpu_util_pct"] == 0 and g["power_w"] < 100 and g["throttle_reasons"] == GPU_IDLE
               and g["sm_clock_mhz"] == 345 for g in sample["gpus"])


def test_temperature_lags_power_and_energy_integrates_it():
    sim = FleetSimulator(1, seed=2, start_ts=TS0, scenario={"name": "crash", "faults": [
        {"kind": "gpu_lost", "at": 5, "host": 0, "gpu": 0}]})
    ticks = run(sim, 40)
    temps = [gpu(t.samples[0], 1)["gpu_temp_c"] for t in ticks]
    powers = [gpu(t.samples[0], 1)["power_w"] for t in ticks]
    assert powers[5] < 100 < powers[4]  # the job crashed: power drops at once
    assert temps[5] > temps[4] - 12 and temps[6] > temps[10] > temps[20]  # temperature follows with a lag
    energy = [gpu(t.samples[0], 1)["energy_mj"] for t in ticks]
    deltas = np.diff(energy) / 1000.0
    assert np.allclose(deltas, powers[1:], rtol=0.01)


def test_counters_are_monotone_and_clocks_stay_in_range():
    ticks = run(FleetSimulator(64, seed=5, start_ts=TS0), 20)
    fields = ["energy_mj", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "pcie_replay_count", "nvlink_crc_errors",
              "nvlink_replay_errors", "remapped_rows_correctable"]
    prev = None
    for tick in ticks:
        now = np.array([[g[f] for f in fields] for s in tick.samples for g in s["gpus"]])
        if prev is not None:
            assert (now >= prev).all()
        prev = now
        clocks = [g["sm_clock_mhz"] for s in tick.samples for g in s["gpus"]]
        assert min(clocks) >= 345 and max(clocks) <= 1980


def test_diurnal_drift_is_slow_and_about_one_percent():
    sim = FleetSimulator(8, seed=0, start_ts=TS0, nccl_interval=1.0)
    base = np.median([r["compute_us"] for r in sim.step().timings])
    later = FleetSimulator(8, seed=0, start_ts=TS0 + 12 * 3600)
    shifted = np.median([r["compute_us"] for r in later.step().timings])
    assert 0.003 < abs(shifted / base - 1) < 0.025


def test_same_seed_same_bytes_other_seed_other_values():
    def dump(seed):
        sim = FleetSimulator(12, seed=seed, scenario="fault-mix", start_ts=TS0)
        return [orjson.dumps([t.samples, t.nccl, t.xid, t.truth]) for t in run(sim, 60)]

    assert dump(7) == dump(7)
    assert dump(7) != dump(8)


def test_nccl_cadence_is_configurable_and_independent_of_telemetry():
    a = FleetSimulator(8, seed=4, start_ts=TS0, nccl_interval=1.0)
    b = FleetSimulator(8, seed=4, start_ts=TS0, nccl_interval=0.25)
    c = FleetSimulator(8, seed=4, start_ts=TS0, nccl_interval=0)
    ta, tb, tc = a.step(), b.step(), c.step()
    world = a.fleet.jobs[0].world_size
    assert len(ta.timings) == world and len(tb.timings) == 4 * world and tc.nccl == []
    assert len(ta.nccl) == world // 8  # one NcclStep per host and collective
    assert ta.samples == tb.samples == tc.samples
    assert sorted({r["seq"] for r in tb.nccl}) == [0, 1, 2, 3]


def test_build_fleet_rejects_nonsense():
    with pytest.raises(ValueError):
        build_fleet(0)
    with pytest.raises(ValueError, match="unknown gpu model"):
        build_fleet(2, gpu_model="B200")


def test_jobs_checkpoint_on_their_own_phase_of_the_interval():
    fleet = build_fleet(64, seed=1, jobs=[16, 16, 16], checkpoint_s=1000.0)
    phases = [job.phase_s for job in fleet.jobs]
    assert phases[0] == 0.0 and len(set(phases)) == 3 and all(0 <= p < 1000 for p in phases)
    job = fleet.jobs[1]  # phase 618.03...
    assert job.checkpoint_before(700.0) == pytest.approx(618.034, abs=1e-3)
    assert job.checkpoint_after(700.0) == pytest.approx(1618.034, abs=1e-3)
    assert job.checkpoint_before(100.0) == pytest.approx(-381.966, abs=1e-3)  # it ran before the run began
    assert job.checkpoint_after(job.phase_s) == job.checkpoint_before(job.phase_s) == job.phase_s


def test_the_simulator_tells_when_a_host_s_job_next_checkpoints():
    sim = FleetSimulator(10, seed=1, start_ts=1_000.0, scenario={"name": "c", "fleet": {"jobs": [4, 4],
                                                                                          "checkpoint_s": 600}})
    assert sim.checkpoint_after("gpu-node-0000", 1_100.0) == 1_600.0  # job-0000: phase 0
    assert sim.checkpoint_after("gpu-node-0004", 1_100.0) == pytest.approx(1_000.0 + 0.618034 * 600, abs=0.01)
    assert sim.checkpoint_after("gpu-node-0009", 1_100.0) is None  # idle
