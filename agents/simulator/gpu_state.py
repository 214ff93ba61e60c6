"""Vectorised GPU physics for the fleet: utilisation drives power drives temperature; clocks, throttling, counters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agents.simulator.fleet import GPUS_PER_HOST, Fleet

# NVML clocks-event reason bits (REFERENCE.md §4).
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x8, 0x20, 0x40
TAU_GPU_S, TAU_HBM_S = 8.0, 15.0  # first-order thermal lag of die and HBM stacks
SW_THERMAL_CLOCK, HW_SLOWDOWN_CLOCK = 0.85, 0.5  # clock ratio while the bit is set (HW slowdown cuts >= 2x)
COMPUTE_BOUND = 0.7  # share of a step that scales with SM clock
# Background rates per GPU per second of rare counter increments.
SBE_RATE, PCIE_RATE, CRC_RATE, NVL_REPLAY_RATE = 2e-5, 1e-5, 3e-5, 1e-5
# Some healthy GPUs log corrected errors steadily for months without failing: a share of them at a steady rate (per
# hour, uniform in the range) [ours]. A trend rule must tell such a trickle from a climb.
CHRONIC_SBE_SHARE, CHRONIC_SBE_PER_H = 0.02, (1.0, 30.0)
DAY_S = 86400.0


def diurnal(ts: float) -> float:
    """Fleet-wide time-of-day swing in [-1, 1]: peaks mid-afternoon UTC (Llama 3 saw 1-2% from DVFS)."""
    return math.sin(2 * math.pi * ((ts % DAY_S) / DAY_S - 0.375))


@dataclass
class Effects:
    """Per-GPU (host_up: per-host) modifiers that active faults set for one tick (defaults = healthy)."""

    power_limit_w: np.ndarray
    temp_target_c: np.ndarray  # NaN = none; else the die is driven at least to this temperature
    crc_rate: np.ndarray
    pcie_rate: np.ndarray
    compute_factor: np.ndarray
    present: np.ndarray
    temp_reading_c: np.ndarray  # NaN = none; else the sensor reports this whatever the die is (a broken sensor)
    power_target_w: np.ndarray  # NaN = none; else the GPU runs flat out drawing this (a power surge)
    transfer_factor: np.ndarray  # collective transfer time of the GPU's job x the largest factor on its ranks
    nccl_stopped: np.ndarray  # the GPU's job has crashed: it writes no NCCL records, its telemetry is untouched
    host_up: np.ndarray  # per host; a host that is down publishes nothing (no sample, status, XID or NCCL record)
    monitor_errors: dict[int, str]  # host -> error of its failing sample collector: no sample, its status says so
    goodbye: np.ndarray  # per host; the agent is stopped in order this tick: its last status says 'stopping'
    # per host and InfiniBand port (agents/simulator/network.py), shape (hosts, GPUS_PER_HOST): one port per GPU
    port_down: np.ndarray  # the link is down
    port_rate: np.ndarray  # NaN = full rate; else the rate it runs at
    port_drops: np.ndarray  # links lost and retrained within this tick
    port_errors: np.ndarray  # mean physical-layer errors added within this tick
    sbe_rate: np.ndarray  # corrected ECC errors added per second (a failing HBM stack)
    pcie_width: np.ndarray  # 0 = the full width; else the lanes the link trained at
    pcie_gen: np.ndarray  # 0 = the full generation; else the one it trained at
    nvlink_down: np.ndarray  # NVLink links inactive (links 0..n-1)
    fabric_failed: np.ndarray  # the GPU's fabric training failed (its Fabric Manager is down)

    @classmethod
    def healthy(cls, fleet: Fleet) -> Effects:
        n, hosts, ports = fleet.n_gpus, fleet.n_hosts, (fleet.n_hosts, GPUS_PER_HOST)
        return cls(np.full(n, fleet.device.power_limit_w), np.full(n, np.nan), np.zeros(n), np.zeros(n),
                   np.ones(n), np.ones(n, dtype=bool), np.full(n, np.nan), np.full(n, np.nan), np.ones(n),
                   np.zeros(n, dtype=bool), np.ones(hosts, dtype=bool), {}, np.zeros(hosts, dtype=bool),
                   np.zeros(ports, dtype=bool), np.full(ports, np.nan), np.zeros(ports, dtype=np.int64),
                   np.zeros(ports), np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                   np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool))


class GpuState:
    """All GPUs' live values as numpy arrays of length hosts*8; `advance` moves them one interval."""

    def __init__(self, fleet: Fleet, rng: np.random.Generator):
        self.fleet, self.rng, spec = fleet, rng, fleet.device
        n, gpu_job = fleet.n_gpus, fleet.gpu_job
        self.in_job = gpu_job >= 0
        job_rng = rng.uniform(size=(max(len(fleet.jobs), 1), 4))
        jg = np.maximum(gpu_job, 0)
        # Per-job workload shape, per-GPU silicon and airflow differences.
        self.util_level = np.where(self.in_job, 90.0 + 9.0 * job_rng[jg, 0], 0.0)
        self.peak_w = spec.idle_power_w + (spec.power_limit_w - spec.idle_power_w) * (0.72 + 0.22 * job_rng[jg, 1])
        self.mem_frac = 0.70 + 0.22 * job_rng[jg, 2]
        self.tensor_share = 0.45 + 0.25 * job_rng[jg, 3]
        self.job_mem_mib = np.round(spec.mem_total_mib * self.mem_frac + rng.normal(0.0, 150.0, n))
        self.r_th = rng.normal(0.060, 0.003, n)  # C per W, die to inlet
        self.r_hbm = rng.normal(0.058, 0.003, n)
        position = np.tile(np.arange(GPUS_PER_HOST), fleet.n_hosts)
        self.inlet_c = 24.0 + 0.4 * position + rng.normal(0.0, 0.8, n)  # rear GPUs breathe warmer air
        self.clock_bin = 15.0 * rng.integers(0, 4, n)  # boost clock differs by a few 15 MHz bins
        # Live values.
        self.util = np.zeros(n)
        self.util_noise = np.zeros(n)
        self.mem_util = np.zeros(n)
        self.sm_active = np.zeros(n)
        self.tensor_active = np.zeros(n)
        self.mem_used = np.zeros(n)
        # Start in thermal steady state at the expected load, so the first minutes need no warm-up.
        self.power = spec.idle_power_w + (self.peak_w - spec.idle_power_w) * self.util_level / 100.0
        self.temp = self.inlet_c + self.r_th * self.power
        self.temp_reading = self.temp.copy()
        self.hbm_temp = self.inlet_c + 3.0 + self.r_hbm * self.power
        self.sm_clock = np.full(n, spec.idle_sm_clock_mhz)
        self.clock_ratio = np.ones(n)
        self.throttle = np.zeros(n, dtype=np.int64)
        self.active = np.zeros(n, dtype=bool)
        self.power_limit = np.full(n, spec.power_limit_w)
        self.energy_mj = (rng.uniform(1, 30, n) * DAY_S * 350.0 * 1000).astype(np.int64)
        self.ecc_sbe_volatile = np.zeros(n, dtype=np.int64)
        self.ecc_sbe_aggregate = rng.poisson(3.0, n).astype(np.int64)
        self.ecc_dbe_volatile = np.zeros(n, dtype=np.int64)
        self.ecc_dbe_aggregate = np.zeros(n, dtype=np.int64)
        self.remapped_correctable = rng.poisson(0.3, n).astype(np.int64)
        self.remapped_uncorrectable = np.zeros(n, dtype=np.int64)
        self.row_remap_pending = np.zeros(n, dtype=bool)
        self.row_remap_failure = np.zeros(n, dtype=bool)
        self.pcie_replay = rng.poisson(1.0, n).astype(np.int64)
        self.nvlink_crc = rng.poisson(5.0, n).astype(np.int64)
        self.nvlink_replay = rng.poisson(1.0, n).astype(np.int64)
        self.nvlink_recovery = np.zeros(n, dtype=np.int64)
        self.remap_banks_none = np.zeros(n, dtype=np.int64)  # banks whose spare rows are spent
        self.pcie_gen = np.full(n, spec.pcie_gen, dtype=np.int64)
        self.pcie_width = np.full(n, spec.pcie_width, dtype=np.int64)
        self.nvlink_mask = np.full(n, (1 << spec.nvlink_links) - 1, dtype=np.int64)
        self.fabric_status = np.full(n, 3, dtype=np.int64)  # DCGM's numbering: 3 success, 4 failure
        self.last_xid = np.full(n, -1, dtype=np.int64)  # -1 = none since driver load
        self.recovery_action = np.zeros(n, dtype=np.int64)
        # The chronic trickles come from a generator of their own, so every other draw is what it was without them.
        self.trickle_rng = rng.spawn(1)[0]
        chronic = self.trickle_rng.uniform(size=n) < CHRONIC_SBE_SHARE
        self.sbe_trickle = np.where(chronic, self.trickle_rng.uniform(*CHRONIC_SBE_PER_H, n) / 3600.0, 0.0)
        self.present = np.ones(n, dtype=bool)
        self.host_up = np.ones(fleet.n_hosts, dtype=bool)
        self.sampling = np.ones(fleet.n_hosts, dtype=bool)  # up, and its sample collector works

    def repaired(self, host: int, replaced: bool = False) -> None:
        """What a completed repair clears on a host's GPUs: a GPU reset or reboot activates a pending row remap, ends
        the recovery action NVML asked for and restarts the counters kept since driver load; a replaced card also
        comes without the old one's remap failure and lifetime error counts."""
        g = slice(host * GPUS_PER_HOST, (host + 1) * GPUS_PER_HOST)
        self.recovery_action[g] = 0
        self.row_remap_pending[g] = False
        self.ecc_dbe_volatile[g] = 0
        self.last_xid[g] = -1
        if replaced:
            self.row_remap_failure[g] = False
            self.remapped_uncorrectable[g] = 0
            self.ecc_dbe_aggregate[g] = 0
            self.ecc_sbe_aggregate[g] = 0
            self.remap_banks_none[g] = 0
            self.sbe_trickle[g] = 0.0  # a new card

    def job_running(self, present: np.ndarray) -> np.ndarray:
        """Per GPU: its job is running (a job with a lost GPU has crashed, so all its GPUs go idle)."""
        gpu_job = self.fleet.gpu_job
        if present.all():
            return self.in_job.copy()
        down = np.unique(gpu_job[~present & self.in_job])
        return self.in_job & ~np.isin(gpu_job, down) & present

    def advance(self, dt: float, ts: float, fx: Effects) -> None:
        spec, rng, n = self.fleet.device, self.rng, self.fleet.n_gpus
        swing = diurnal(ts)
        self.present = fx.present.copy()
        self.host_up = fx.host_up.copy()
        self.sampling = self.host_up.copy()
        self.sampling[list(fx.monitor_errors)] = False
        surge = ~np.isnan(fx.power_target_w) & fx.present
        self.active = self.job_running(fx.present) | surge
        # Utilisation: per-job level plus AR(1) noise; idle GPUs read 0; a surging GPU runs flat out.
        self.util_noise = 0.7 * self.util_noise + rng.normal(0.0, 1.2, n)
        self.util = np.where(self.active, np.clip(self.util_level + self.util_noise, 0.0, 100.0), 0.0)
        self.util[surge] = 100.0
        self.mem_util = np.where(self.active, np.clip(0.45 * self.util + rng.normal(0.0, 2.0, n), 0.0, 100.0), 0.0)
        self.sm_active = np.where(self.active, np.clip(0.0082 * self.util + rng.normal(0.0, 0.01, n), 0.0, 1.0), 0.0)
        self.tensor_active = self.sm_active * self.tensor_share
        self.mem_used = np.where(self.active, self.job_mem_mib, 0.0)
        # Temperature lags the power of the previous interval; a runaway drives it to its own target.
        inlet = self.inlet_c + 1.5 * swing
        target = inlet + self.r_th * self.power
        forced = ~np.isnan(fx.temp_target_c)
        lift = np.where(forced, np.maximum(np.nan_to_num(fx.temp_target_c) - target, 0.0), 0.0)
        self.temp += (target + lift - self.temp) * (1.0 - math.exp(-dt / TAU_GPU_S))
        hbm_target = inlet + 3.0 + self.r_hbm * self.power + 0.6 * lift
        self.hbm_temp += (hbm_target - self.hbm_temp) * (1.0 - math.exp(-dt / TAU_HBM_S))
        # Throttle reasons from the temperatures just read (a broken sensor's reading counts), then clocks, power.
        self.temp_reading = np.where(np.isnan(fx.temp_reading_c), self.temp, fx.temp_reading_c)
        die, hbm = np.rint(self.temp_reading), np.rint(self.hbm_temp)  # NVML reads whole degrees; limits too
        hw = die >= spec.slowdown_temp_c
        sw = (die >= spec.gpu_max_op_temp_c) | (hbm >= spec.hbm_max_op_temp_c)
        ratio = np.where(hw, HW_SLOWDOWN_CLOCK, np.where(sw, SW_THERMAL_CLOCK, 1.0))
        demand_dyn = (self.peak_w - spec.idle_power_w) * self.util / 100.0
        demand_dyn *= (1.0 + 0.01 * swing) * (1.0 + rng.normal(0.0, 0.015, n)) * ratio ** 2
        demand_dyn[surge] = fx.power_target_w[surge] - spec.idle_power_w
        self.power_limit = fx.power_limit_w.copy()
        headroom = np.maximum(self.power_limit * rng.uniform(0.985, 0.998, n) - spec.idle_power_w, 1.0)
        capped = self.active & (demand_dyn > headroom)
        ratio = np.where(capped, ratio * (headroom / np.maximum(demand_dyn, 1.0)) ** (1.0 / 3.0), ratio)
        dyn = np.where(capped, headroom, np.maximum(demand_dyn, 0.0))
        self.power = np.minimum(spec.idle_power_w * (1.0 + rng.normal(0.0, 0.01, n)) + dyn, self.power_limit)
        self.clock_ratio = np.where(self.active, ratio, 1.0)
        boost = spec.max_sm_clock_mhz - self.clock_bin
        self.sm_clock = np.where(self.active, np.floor(boost * self.clock_ratio / 15.0) * 15.0, spec.idle_sm_clock_mhz)
        self.throttle = (np.where(~self.active, GPU_IDLE, 0) | np.where(capped, SW_POWER_CAP, 0)
                         | np.where(sw, SW_THERMAL, 0) | np.where(hw, HW_THERMAL | HW_SLOWDOWN, 0))
        self.energy_mj += np.rint(self.power * dt * 1000.0).astype(np.int64)
        self._count_errors(dt, fx)
        self._links(fx)

    def _links(self, fx: Effects) -> None:
        """PCIe width and generation, active NVLink links and the fabric's status, as this tick's faults leave them."""
        spec = self.fleet.device
        self.pcie_width = np.where(fx.pcie_width > 0, fx.pcie_width, spec.pcie_width)
        self.pcie_gen = np.where(fx.pcie_gen > 0, fx.pcie_gen, spec.pcie_gen)
        full = (1 << spec.nvlink_links) - 1
        self.nvlink_mask = full & ~((1 << np.minimum(fx.nvlink_down, spec.nvlink_links)) - 1)
        self.fabric_status = np.where(fx.fabric_failed, 4, 3)

    def _count_errors(self, dt: float, fx: Effects) -> None:
        rng = self.rng
        sbe = rng.poisson((SBE_RATE + fx.sbe_rate) * dt) + self.trickle_rng.poisson(self.sbe_trickle * dt)
        self.ecc_sbe_volatile += sbe
        self.ecc_sbe_aggregate += sbe
        self.pcie_replay += rng.poisson((PCIE_RATE + fx.pcie_rate) * dt)
        self.nvlink_crc += rng.poisson((CRC_RATE + fx.crc_rate) * dt)
        self.nvlink_replay += rng.poisson((NVL_REPLAY_RATE + 0.1 * fx.crc_rate) * dt)
        self.nvlink_recovery += rng.poisson(0.005 * fx.crc_rate * dt)

    def step_time_factor(self) -> np.ndarray:
        """How much longer a step takes at the current clocks: compute-bound share scales with 1/clock."""
        return COMPUTE_BOUND / self.clock_ratio + (1.0 - COMPUTE_BOUND)
