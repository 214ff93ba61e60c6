"""Ground truth of one injection: where and when it hit, its hardware flag, and the signals a detector should raise."""

from __future__ import annotations

from agents.simulator import xid
from agents.simulator.fleet import GPUS_PER_HOST, Fleet
from agents.simulator.kinds import COMMON_FIELDS

# Tokens per kind (README "Ground truth"). Kinds with [] show nothing a current detector looks for: a slow link,
# a crashed job and a silent host leave no GPU signal, and only the scenario knows a rack's power budget.
EXPECTED = {
    "thermal_runaway": ["alert:thermal", "throttle:hw_thermal"],
    "power_cap": ["throttle:sw_power_cap"],
    "slow_rank": ["straggler"],
    "ecc_dbe": ["fault:ecc_dbe", "fault:xid:48", "bin:reset", "drain"],
    "row_remap_failure": ["fault:row_remap_failure", "fault:xid:64", "bin:replace", "drain"],
    "nvlink_crc": ["fault:nvlink_crc"],
    "pcie_replay": ["fault:pcie_replay"],
    "gpu_lost": ["fault:gpu_lost", "fault:xid:79", "bin:reboot", "drain"],
    "congestion": [],
    "sensor_flap": [],  # + alert:thermal when the high reading reaches the GPU's max operating temperature
    "host_down": [],
    "job_crash": [],
    "power_surge": [],
}
SLOWS_RANK = {"thermal_runaway", "power_cap"}  # these also make the GPU's rank a straggler...
# ...when they last long enough to be one: 3 of 5 straggler windows of 30 s (streams/stragglers/scoring.py) plus the
# window that closes the third; slowness that clears sooner is transient by design and must raise nothing.
STRAGGLER_MIN_S = 120.0
NOT_HARDWARE = {"congestion", "job_crash", "power_surge"}  # a busy link, a crashed process, a heavy load
# Bins that take the node out of service: the GPU needs a reset, a reboot, a person or a new part.
DRAIN_BINS = {"reset", "reboot", "inspect", "replace"}


def expected_tokens(spec, fleet: Fleet, ranked: bool) -> tuple[list[str], bool]:
    """(expected tokens, hardware) the kind and its parameters imply, before the scenario's overrides.

    `ranked`: the GPU runs a job and the run publishes NCCL records, without which no straggler can be seen.
    """
    if spec.kind == "xid":
        tokens, bin_ = [f"fault:xid:{spec.code}"], xid.EXPECTED_BIN.get(spec.code)
        if bin_ is not None:
            tokens.append(f"bin:{bin_}")
        if bin_ in DRAIN_BINS:
            tokens.append("drain")
        return tokens, spec.code not in xid.SOFTWARE_CODES
    tokens = [t for t in EXPECTED[spec.kind] if ranked or t != "straggler"]
    if spec.kind in SLOWS_RANK and ranked and (spec.duration is None or spec.duration >= STRAGGLER_MIN_S):
        tokens.append("straggler")
    if spec.kind == "sensor_flap" and spec.high_c >= fleet.device.gpu_max_op_temp_c:
        tokens.append("alert:thermal")
    return tokens, spec.kind not in NOT_HARDWARE


def truth_record(*, run_id: str, number: int, spec, fleet: Fleet, host: int, gpus, job: str | None,
                 rank: int | None, start_ts: float, nccl: bool) -> dict:
    """The InjectedFault dict (schemas/analytics.py) of injection `number`; `nccl`: the run publishes NCCL records."""
    expected, hardware = expected_tokens(spec, fleet, nccl and job is not None)
    params = {k: float(v) for k, v in spec.model_dump(exclude=COMMON_FIELDS).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {
        "run_id": run_id, "fault_id": f"{run_id}-{number:03d}",
        "kind": f"xid{spec.code}" if spec.kind == "xid" else spec.kind, "cause": spec.cause,
        "host": fleet.hosts[host], "rack": fleet.racks[host],
        "gpu_index": int(gpus[0] % GPUS_PER_HOST) if len(gpus) == 1 else None,
        "job": job, "rank": rank, "ts": start_ts + spec.at,
        "end_ts": None if spec.duration is None else start_ts + spec.end,
        "hardware": spec.hardware if spec.hardware is not None else hardware,
        "expected": spec.expect if spec.expect is not None else expected, "params": params,
    }
