"""Turns the fleet's state arrays into one HostSample dict per host, column-wise so 16k GPUs stay cheap."""

from __future__ import annotations

import uuid

import numpy as np

from agents.simulator.fleet import GPUS_PER_HOST, Fleet
from agents.simulator.gpu_state import GpuState

# Hopper replaced page retirement by row remapping: NVML answers NOT_SUPPORTED for these.
UNSUPPORTED = ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending")


def _columns(fleet: Fleet, s: GpuState) -> dict[str, list]:
    """Every GpuReading field as a Python list over all GPUs (numpy does the maths, tolist the boxing)."""
    n, spec = fleet.n_gpus, fleet.device

    def const(value):
        return [value] * n

    return {
        "index": np.tile(np.arange(GPUS_PER_HOST), fleet.n_hosts).tolist(),
        "uuid": [u for host in fleet.uuids for u in host],
        "pci_bus_id": list(fleet.pci_ids) * fleet.n_hosts,
        "model": const(spec.model),
        "gpu_util_pct": np.rint(s.util).tolist(),
        "mem_util_pct": np.rint(s.mem_util).tolist(),
        "sm_active": np.round(s.sm_active, 3).tolist(),
        "tensor_active": np.round(s.tensor_active, 3).tolist(),
        "mem_used_mib": s.mem_used.tolist(),
        "mem_total_mib": const(spec.mem_total_mib),
        "sm_clock_mhz": s.sm_clock.tolist(),
        "mem_clock_mhz": const(spec.mem_clock_mhz),
        "gpu_temp_c": np.rint(s.temp_reading).tolist(),
        "hbm_temp_c": np.rint(s.hbm_temp).tolist(),
        "power_w": np.round(s.power, 3).tolist(),
        "power_limit_w": s.power_limit.tolist(),
        "power_default_limit_w": const(spec.power_limit_w),
        "energy_mj": s.energy_mj.tolist(),
        "throttle_reasons": s.throttle.tolist(),
        "slowdown_temp_c": const(spec.slowdown_temp_c),
        "shutdown_temp_c": const(spec.shutdown_temp_c),
        "gpu_max_op_temp_c": const(spec.gpu_max_op_temp_c),
        "hbm_max_op_temp_c": const(spec.hbm_max_op_temp_c),
        "ecc_sbe_volatile": s.ecc_sbe_volatile.tolist(),
        "ecc_dbe_volatile": s.ecc_dbe_volatile.tolist(),
        "ecc_sbe_aggregate": s.ecc_sbe_aggregate.tolist(),
        "ecc_dbe_aggregate": s.ecc_dbe_aggregate.tolist(),
        "retired_pages_sbe": const(None),
        "retired_pages_dbe": const(None),
        "retired_pages_pending": const(None),
        "remapped_rows_correctable": s.remapped_correctable.tolist(),
        "remapped_rows_uncorrectable": s.remapped_uncorrectable.tolist(),
        "row_remap_pending": s.row_remap_pending.tolist(),
        "row_remap_failure": s.row_remap_failure.tolist(),
        "remap_banks_max": (spec.remap_banks - s.remap_banks_none).tolist(),
        "remap_banks_high": const(0),
        "remap_banks_partial": const(0),
        "remap_banks_low": const(0),
        "remap_banks_none": s.remap_banks_none.tolist(),
        "pcie_replay_count": s.pcie_replay.tolist(),
        "pcie_link_gen": s.pcie_gen.tolist(),
        "pcie_link_gen_max": const(spec.pcie_gen),
        "pcie_link_width": s.pcie_width.tolist(),
        "pcie_link_width_max": const(spec.pcie_width),
        "nvlink_crc_errors": s.nvlink_crc.tolist(),
        "nvlink_replay_errors": s.nvlink_replay.tolist(),
        "nvlink_recovery_errors": s.nvlink_recovery.tolist(),
        "nvlink_links": const(spec.nvlink_links),
        "nvlink_active_mask": s.nvlink_mask.tolist(),
        # one clique per NVLink domain (an HGX board: its host; an NVL72 rack: its 18 trays), one fabric cluster per
        # simulated cluster
        "fabric_status": s.fabric_status.tolist(),
        "fabric_clique_id": np.repeat(np.arange(fleet.n_hosts) // fleet.domain_hosts + 1, GPUS_PER_HOST).tolist(),
        "fabric_cluster_uuid": const(str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{fleet.cluster}.fleetpulse"))),
        "fabric_health_mask": const(0),
        "last_xid": [None if x < 0 else x for x in s.last_xid.tolist()],
        "recovery_action": s.recovery_action.tolist(),
    }


def gpu_readings(fleet: Fleet, state: GpuState) -> list[dict]:
    """One GpuReading dict per GPU, in global GPU order (lost GPUs included; the caller drops them)."""
    cols = _columns(fleet, state)
    cols["unsupported"] = [list(UNSUPPORTED) for _ in range(fleet.n_gpus)]
    names = list(cols)
    return [dict(zip(names, row)) for row in zip(*cols.values())]


def host_samples(fleet: Fleet, state: GpuState, *, ts: float, seq: int) -> list[dict]:
    """One HostSample dict per host at `ts`; a lost GPU is absent from its host's list; a host that is down, or whose
    sample collector fails, sends none."""
    readings = gpu_readings(fleet, state)
    missing = set(np.flatnonzero(~state.present) // GPUS_PER_HOST)
    out = []
    for h, name in enumerate(fleet.hosts):
        if not state.sampling[h]:
            continue
        gpus = readings[h * GPUS_PER_HOST:(h + 1) * GPUS_PER_HOST]
        if h in missing:
            gpus = [g for i, g in enumerate(gpus) if state.present[h * GPUS_PER_HOST + i]]
        out.append({
            "schema_version": 1, "host": name, "rack": fleet.racks[h], "cluster": fleet.cluster,
            "job": fleet.job_name_of_host(h), "ts": ts, "seq": seq, "source": "simulator",
            "driver_version": fleet.driver_version, "gpus": gpus,
        })
    return out
