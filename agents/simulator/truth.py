"""Ground truth of one injection: where and when it hit, its hardware flag, and the signals a detector should raise."""

from __future__ import annotations

import math
from collections.abc import Sequence

from agents.simulator import xid
from agents.simulator.fleet import GPUS_PER_HOST, Fleet
from agents.simulator.kinds import COMMON_FIELDS
from agents.simulator.network import NET_EVERY_S

# Tokens per kind (README "Ground truth"). Kinds with [] show nothing a current detector looks for: a slow link
# leaves no GPU signal, and only the scenario knows a rack's power budget. host_down is a host that goes silent with no
# goodbye (the silence stage's host_silent fault, drained for a reboot); an announced one (its agent said 'stopping'),
# a whole rack (one alert for the rack) and a short one are in expected_tokens; a job stall in stalls_job.
EXPECTED = {
    "thermal_runaway": ["alert:thermal", "throttle:hw_thermal"],
    "power_cap": ["throttle:sw_power_cap"],  # + alert:GpuPowerLimitReduced when a sample sees the limit 3 % under
    # the default (power_limit_seen)
    "slow_rank": ["straggler"],
    "ecc_dbe": ["fault:ecc_dbe", "fault:xid:48", "bin:reset", "drain"],
    "row_remap_failure": ["fault:row_remap_failure", "fault:xid:64", "bin:replace", "drain"],
    "nvlink_crc": ["fault:nvlink_crc"],
    "pcie_replay": ["fault:pcie_replay"],
    "gpu_lost": ["fault:gpu_lost", "fault:xid:79", "bin:reboot", "drain"],
    "congestion": [],
    "sensor_flap": [],  # + alert:thermal when the high reading reaches the GPU's max operating temperature, + drain
    # when the recurring-problems policy says so (flap_outcome)
    "host_down": ["fault:host_silent", "bin:reboot", "drain"],
    "job_crash": [],  # + alert:JobStalled when the run publishes NCCL records (stalls_job)
    "power_surge": [],
    "monitor_broken": ["alert:MonitorBroken"],
    # InfiniBand ports and host kernel lines (streams/fault_bins/host_rules.py): a link going down counts as a drop
    # (ib_link_flap, recorded) before it is down for good (ib_link_down); a failed NIC logs command timeouts, then its
    # fatal error (drained for a reboot), then its link is down; a failing disk logs each stage of its failure.
    "link_down": ["fault:ib_link_flap", "fault:ib_link_down", "bin:inspect", "drain"],
    "link_degraded": ["fault:ib_rate_degraded", "bin:inspect", "drain"],
    "nic_down": ["fault:mlx5_cmd_timeout", "fault:mlx5_health_compromised", "fault:ib_link_flap", "fault:ib_link_down",
                 "bin:inspect", "drain"],  # drained for a reboot, then its dead link asks for a person
    "ssd_error": ["fault:nvme_timeout", "fault:nvme_controller_down", "fault:block_io_error", "fault:fs_error",
                  "fault:fs_readonly", "bin:reboot", "drain"],
    "link_flap": ["fault:ib_link_flap"],  # + bin:inspect and drain at FLAP_LIMIT drops within the hour
    # The host around the GPUs, from its kernel log alone: an uncorrected machine check asks for the vendor's
    # diagnostics, a filesystem that shut down for a check at reboot, a cable's module error for a person; a port that
    # never had a cable says so at boot and is no fault.
    "machine_check": ["fault:mce_uncorrected", "fault:memory_ue", "bin:replace", "drain"],
    "fs_shutdown": ["fault:fs_error", "fault:fs_readonly", "bin:reboot", "drain"],
    "cable_error": ["fault:mlx5_module_error", "bin:inspect", "drain"],
    "cable_absent": [],
    # Faults with no Xid, seen in the GPU's own readings (streams/fault_bins/gpu_links.py, counters.py): a
    # corrected-error flood (reset, then replace if it floods again), a PCIe link trained down (a person reseats
    # it), NVLink links gone inactive (a reset trains them again), a fabric that failed to train (restart the Fabric
    # Manager: a reboot).
    "ecc_flood": ["fault:ecc_sbe_flood", "bin:reset", "drain"],
    # A memory ramp is suspect while it climbs (ecc_trend: drained once its job is done, never at once); the failure it
    # heads for may come first where the repair is slower than the climb (allowed_tokens)
    "ecc_ramp": ["fault:ecc_trend", "bin:inspect", "drain"],
    "pcie_downtrain": ["fault:pcie_downtrained", "bin:inspect", "drain"],
    "nvlink_inactive": ["fault:nvlink_down", "bin:reset", "drain"],
    "fabric_down": ["fault:fabric_failed", "bin:reboot", "drain"],
}
# Port rules' defaults (streams/fault_bins/config.py) against the simulator's port samples at every multiple of
# NET_EVERY_S (30 s, for intervals that divide it): a link seen down from one sample to one link_down_s (60 s) later,
# a rate below the port's best as long, the 3rd drop within an hour, physical-layer errors rising more than 50 within
# 5 min (a flapping link's, from its first drop to its last). A port fault from t = 0 is in the first sample, which
# the rules take as the port's baseline (never seen ACTIVE, its full rate unseen, its drop already counted).
FLAP_LIMIT, FLAP_WINDOW_S = 3, 3600.0
# The GPU link rules' defaults (streams/fault_bins/config.py): a link below its width or generation, or NVLink links
# inactive, in every sample for GPU_LINK_DEGRADED_S; a generation drop counts only on a busy GPU (one running a job).
# Corrected errors flood at more than ECC_SBE_PER_S over ECC_SBE_WINDOW_S: a flood at twice that rate lasting the
# window and two samples more is one, one at half of it or less is none; between, Poisson noise decides.
GPU_LINK_DEGRADED_S = 60.0
ECC_SBE_PER_S, ECC_SBE_WINDOW_S = 10.0, 60.0
LINK_DOWN_S = DEGRADED_S = 60.0
PHY_ERRORS_PER_WINDOW, PHY_WINDOW_S = 50.0, 300.0
RACK_DOWN = ["alert:RackSilent"]  # a whole rack silent at once: one alert for the rack, no host fault, no drain
JOB_STALLED = "alert:JobStalled"
POWER_LIMIT_REDUCED = "alert:GpuPowerLimitReduced"
# A silence or a stall shorter than this clears before the silence stage's thresholds by design (streams/silence/
# rules.py SilenceConfig: a host silent_after_s 60 + group_wait_s 30 behind a fleet clock up to a sample interval
# late; a job's collectives stall_after_s 120): such a host_down, whole rack or stopped job expects nothing.
SILENCE_MIN_S = 150.0
# A host silent for less than this is never judged (silent_after_s); between the two, when its last sample fell and
# when the fleet clock judges decide (a host 120 s down was drained 80 s into it: fleetpulse/evaluate/sweep.py outages
# judges that band as "either"; a scenario's score counts such a drain as false).
SILENCE_TRANSIENT_S = 60.0
# The lifecycle's recurring-problems policy (streams/lifecycle/rules.py LifecycleConfig, docs/remediation.md) against a
# GPU whose reading flaps across its throttle limits, as its samples see it (a period near the sample interval
# aliases): the node's score falls below 60 a few samples into a hot spell, and the spell drains it once it is one
# continuous episode past enter_dwell_s + drain_dwell_s (720 s) after that, about 920 s into it; or the node drains
# once it spent more than low_share_inspect (75 %) of an hour below 60, which a share of hot samples well above it
# does within the hour. Between the bands either may happen: truth expects no drain there, and sweeps skip them.
FLAP_SPELL_DRAIN_S, FLAP_SPELL_SAFE_S = (840.0, 960.0), 7200.0
FLAP_SHARE_DRAIN, FLAP_SHARE_AFTER_S = (0.7, 0.8), 3600.0
SLOWS_RANK = {"thermal_runaway", "power_cap"}  # these also make the GPU's rank a straggler...
# ...when they last long enough to be one: 8 of 10 straggler windows of 10 s (streams/stragglers/scoring.py) flag
# slowness of 90 s or more 75-90 s after onset; slowness of STRAGGLER_TRANSIENT_S or less touches at most 7 windows
# and is transient by design: it must raise nothing. Between the two, the phase of the window grid decides (the
# sweeps judge that band as "either"; a scenario's score counts a flag in it as another rank flagged).
STRAGGLER_MIN_S, STRAGGLER_TRANSIENT_S = 120.0, 60.0
# A rank STRAGGLER_MIN_PCT slower is one (SuperBench's defect threshold, ALGORITHMS.md §2.9); under STRAGGLER_QUIET_PCT
# it is within a window's scatter of the rule's 4 % floor and must never be flagged; between, the scatter decides.
STRAGGLER_MIN_PCT, STRAGGLER_QUIET_PCT = 5.0, 3.0
# A busy link, a crashed process, a heavy load, a failing monitoring library; an announced host_down (maintenance)
# is not hardware either (expected_tokens).
NOT_HARDWARE = {"congestion", "job_crash", "power_surge", "monitor_broken", "cable_absent"}  # port, NIC, disk faults
# are hardware; a port that never had a cable is no fault at all
# Bins that take the node out of service: the GPU needs a reset, a reboot, a person or a new part.
DRAIN_BINS = {"reset", "reboot", "inspect", "replace"}


def truth_kind(spec) -> str:
    """The truth's kind: the fault kind, `xid<code>` for an XID, `rack_down` for a whole rack's host_down."""
    if spec.kind == "xid":
        return f"xid{spec.code}"
    if spec.kind == "host_down" and spec.whole_rack:
        return "rack_down"
    return spec.kind


def lasts(spec, seconds: float) -> bool:
    return spec.duration is None or spec.duration >= seconds


def stalls_job(spec, fleet: Fleet, job: str | None, down: Sequence[int] = ()) -> bool:
    """The fault stops its job's NCCL records for SILENCE_MIN_S or more while some host of the job still reports
    samples naming it: a crashed or hung job (job_crash, an XID with crash_job), a GPU fallen off the bus (its host
    reports on), or hosts that go down (`down`: one, or a whole rack) while others of the job report on."""
    if job is None or not lasts(spec, SILENCE_MIN_S):
        return False
    if spec.kind in ("job_crash", "gpu_lost") or (spec.kind == "xid" and spec.crash_job):
        return True
    if spec.kind == "host_down":
        hosts = next(j.hosts for j in fleet.jobs if j.name == job)
        return not set(hosts) <= set(down)
    return False


def expected_tokens(spec, fleet: Fleet, ranked: bool, stalled: bool = False,
                    interval: float = 10.0, busy: bool = True) -> tuple[list[str], bool]:
    """(expected tokens, hardware) the kind and its parameters imply, before the scenario's overrides.

    `ranked`: the GPU runs a job and the run publishes NCCL records, without which no straggler can be seen.
    `stalled`: the fault stops a job's NCCL records while its hosts report on (stalls_job), in a run with NCCL.
    `busy`: the GPU runs a job (a PCIe generation below the maximum counts only then).
    """
    tokens, hardware = _tokens(spec, fleet, ranked, interval, busy)
    if stalled:
        tokens.append(JOB_STALLED)
    return tokens, hardware


def _tokens(spec, fleet: Fleet, ranked: bool, interval: float, busy: bool = True) -> tuple[list[str], bool]:
    if spec.kind == "xid":
        tokens, bin_ = [f"fault:xid:{spec.code}"], xid.EXPECTED_BIN.get(spec.code)
        if bin_ is not None:
            tokens.append(f"bin:{bin_}")
        if bin_ in DRAIN_BINS:
            tokens.append("drain")
        return tokens, spec.code not in xid.SOFTWARE_CODES
    if spec.kind == "host_down" and (spec.announced or spec.whole_rack or not lasts(spec, SILENCE_MIN_S)):
        # an agent stopped in order said goodbye (planned work: nothing to detect, not hardware); a whole rack is
        # one rack alert (its switch, not its hosts: nothing to drain); a short outage clears before it is silence
        alert = spec.whole_rack and not spec.announced and lasts(spec, SILENCE_MIN_S)
        return (list(RACK_DOWN) if alert else []), not spec.announced
    if spec.kind in ("link_flap", "link_down", "link_degraded"):
        return _port_tokens(spec), True
    if spec.kind == "nic_down" and (spec.at == 0 or not _sampled_for(spec, LINK_DOWN_S)):
        # its link never seen up (down from the first sample), or back before it counts as down: the NIC's lines
        keep = [t for t in EXPECTED["nic_down"] if t not in ("fault:ib_link_down", "bin:inspect")]
        keep = [t for t in keep if spec.at > 0 or t != "fault:ib_link_flap"]
        return [*keep[:-1], "bin:reboot", keep[-1]], True
    if spec.kind in GPU_LINK_KINDS:
        return (list(EXPECTED[spec.kind]) if gpu_link_outcome(spec, interval, busy) == "fault" else []), True
    slow = spec.kind != "slow_rank" or straggler_outcome(spec) == "straggler"
    tokens = [t for t in EXPECTED[spec.kind] if (ranked and slow) or t != "straggler"]
    if spec.kind in SLOWS_RANK and ranked and lasts(spec, STRAGGLER_MIN_S):
        tokens.append("straggler")
    if spec.kind == "power_cap" and power_limit_seen(spec, fleet, interval):
        tokens.insert(0, POWER_LIMIT_REDUCED)
    if spec.kind == "sensor_flap" and spec.high_c >= fleet.device.gpu_max_op_temp_c:
        tokens.append("alert:thermal")
        if flap_outcome(spec, interval) == "drain":
            tokens.append("drain")
    return tokens, spec.kind not in NOT_HARDWARE


GPU_LINK_KINDS = frozenset({"ecc_flood", "ecc_ramp", "pcie_downtrain", "nvlink_inactive", "fabric_down"})
RAMP_FAILS = {"dbe": ["fault:ecc_dbe", "fault:xid:48", "fault:row_remap_pending", "bin:reset"],
              "row_remap_failure": ["fault:row_remap_failure", "fault:xid:64", "bin:replace"], "none": []}
# The trend rule's defaults (streams/fault_bins/trends.py): the corrected-error rate's 30 min average against its 6 h
# one; a ramp it calls a climb (on the expected counts) RAMP_MARGIN_S before its failure is expected to be suspect.
TREND_FAST_S, TREND_SLOW_S, TREND_MIN_PER_H, TREND_GROWTH, TREND_SIGMA = 1800.0, 21600.0, 30.0, 2.0, 4.0
RAMP_MARGIN_S = 600.0


def gpu_link_outcome(spec, interval: float, busy: bool = True) -> str:
    """What a fault of the GPU's own readings must raise: "fault", "nothing", or "either" (an ECC flood near the rule's
    rate, where Poisson noise decides). Samples fall every `interval` s from t = 0."""
    first = math.ceil(spec.at / interval) * interval  # the first sample that shows it

    def shown_for(seconds: float) -> bool:  # a sample `seconds` after the first still inside the fault
        return first + math.ceil(seconds / interval) * interval < spec.end

    if spec.kind == "fabric_down":
        return "fault" if shown_for(0) else "nothing"
    if spec.kind == "ecc_ramp":
        seen = ramp_suspect_at(spec, interval)
        return "fault" if seen is not None and seen + RAMP_MARGIN_S < min(spec.end, spec.at + spec.lead_s) \
            else "either"
    if spec.kind == "ecc_flood":
        if spec.rate_per_s <= ECC_SBE_PER_S / 2 or not shown_for(0):
            return "nothing"
        return "fault" if spec.rate_per_s >= 2 * ECC_SBE_PER_S and shown_for(ECC_SBE_WINDOW_S + interval) else "either"
    if spec.kind == "pcie_downtrain" and spec.width is None and not busy:
        return "nothing"  # a generation below the maximum on an idle GPU is power saving
    if spec.kind == "nvlink_inactive" and spec.at == 0 and spec.gpu is None:
        return "nothing"  # every GPU of the host without its links from the start: nothing shows what they should be
    return "fault" if shown_for(GPU_LINK_DEGRADED_S) else "nothing"


def ramp_suspect_at(spec, interval: float = 10.0) -> float | None:
    """When the trend rule, fed the expected rate (no noise) every sample, first calls a memory ramp a climb: None if
    never within its lead. Mirrors streams/fault_bins/trends.py with its defaults (agents may not import a stage)."""
    t, fast, slow = 0.0, 0.0, 0.0  # the GPU is read from the run's start: nothing before the ramp
    while t <= spec.at + spec.lead_s:
        t += interval
        rate = spec.rate_per_s(t) if t > spec.at else 0.0
        fast += max(1.0 - math.exp(-interval / TREND_FAST_S), interval / t) * (rate - fast)
        slow += max(1.0 - math.exp(-interval / TREND_SLOW_S), interval / t) * (rate - slow)
        if fast <= 0:
            continue
        z = (fast - slow) / math.sqrt(fast / (2 * TREND_FAST_S) + slow / (2 * TREND_SLOW_S))
        if fast * 3600 >= TREND_MIN_PER_H and fast >= TREND_GROWTH * slow and z >= TREND_SIGMA:
            return t
    return None


def power_limit_reduced(spec, fleet: Fleet) -> bool:
    """A power cap 3 % or more under the board's default limit: what GpuPowerLimitReduced fires on (its scale 1.03,
    streams/power_thermal/rules.py; agents may not import a stage)."""
    return spec.cap_w * 1.03 <= fleet.device.power_limit_w


def power_limit_seen(spec, fleet: Fleet, interval: float) -> bool:
    """A reduced power limit that a sample sees: the cap lasts a sample interval."""
    return power_limit_reduced(spec, fleet) and lasts(spec, interval)


def straggler_outcome(spec) -> str:
    """What a slow_rank must raise: "straggler", "nothing" (transient, or too small a slowdown to be one), or
    "either" (a band where the window grid's phase or a window's scatter decides)."""
    short = spec.duration is not None and spec.duration <= STRAGGLER_TRANSIENT_S
    if short or spec.slowdown_pct < STRAGGLER_QUIET_PCT:
        return "nothing"
    if lasts(spec, STRAGGLER_MIN_S) and spec.slowdown_pct >= STRAGGLER_MIN_PCT:
        return "straggler"
    return "either"


def flap_outcome(spec, interval: float) -> str:
    """What the recurring-problems policy does with a throttling sensor flap, from the samples that see it (every
    `interval` s from t = 0): "drain" (a hot spell one continuous episode past the drain dwell, or hot samples well over
    the hourly share for an hour), "alert" (alerts only), or "either" (in a band where timing decides)."""
    lasts_s = math.inf if spec.duration is None else spec.duration
    first = math.ceil(spec.at / interval) * interval
    times = [first + k * interval for k in range(int(min(lasts_s, FLAP_SPELL_SAFE_S) // interval))]
    hot = [(t - spec.at) % spec.period_s < spec.duty * spec.period_s for t in times]
    spell = run = 0
    for h in hot:
        run = run + 1 if h else 0
        spell = max(spell, run)
    spell_s = spell * interval
    hour = hot[:int(FLAP_SHARE_AFTER_S // interval)]
    share = sum(hour) / len(hour) if len(hour) * interval >= FLAP_SHARE_AFTER_S else 0.0
    if spell_s >= FLAP_SPELL_DRAIN_S[1] or share >= FLAP_SHARE_DRAIN[1]:
        return "drain"
    if spell_s > FLAP_SPELL_DRAIN_S[0] or share > FLAP_SHARE_DRAIN[0]:
        return "either"
    return "alert"


def _sampled_for(spec, seconds: float) -> bool:
    """Two port samples at least `seconds` apart fall within the fault."""
    first = math.ceil(spec.at / NET_EVERY_S) * NET_EVERY_S
    return first + seconds < spec.end


def _phy_errors_seen(spec, drops: list[float]) -> bool:
    """The port rule's errors (symbol errors at `errors_per_s` from the first drop to the last, plus a link error
    recovery per drop) rise more than its limit between two port samples at most PHY_WINDOW_S apart."""
    last = drops[-1] if drops else spec.at

    def errors(t: float) -> int:
        return math.floor(spec.errors_per_s * (min(t, last) - spec.at)) + sum(d <= t for d in drops) if t >= spec.at \
            else 0

    step = int(PHY_WINDOW_S // NET_EVERY_S)
    samples = [k * NET_EVERY_S for k in range(int(last // NET_EVERY_S) + step + 2)]
    return any(errors(b) - errors(a) > PHY_ERRORS_PER_WINDOW
               for i, a in enumerate(samples) for b in samples[i + 1:i + 1 + step])


def _port_tokens(spec) -> list[str]:
    """What the port samples (every NET_EVERY_S from t = 0, the first a baseline) can show of a port fault."""
    if spec.kind == "link_flap":
        drops = [t for t in (spec.at + k * spec.every for k in range(spec.flaps)) if t < spec.end]
        counted = [t for t in drops if t > 0]  # a drop at t = 0 is in the first sample's counter already
        inspect = any(sum(0 <= t - t0 < FLAP_WINDOW_S for t in counted) >= FLAP_LIMIT for t0 in counted)
        noisy = _phy_errors_seen(spec, drops)
        return [*(["fault:ib_link_flap"] if counted else []), *(["fault:ib_phy_errors"] if noisy else []),
                *(["bin:inspect", "drain"] if inspect or noisy else [])]
    if spec.kind == "link_down":
        if spec.at == 0:  # down from the first sample: never seen ACTIVE, so no fault of its
            return []
        return list(EXPECTED["link_down"]) if _sampled_for(spec, LINK_DOWN_S) else ["fault:ib_link_flap"]
    return list(EXPECTED["link_degraded"]) if spec.at > 0 and _sampled_for(spec, DEGRADED_S) else []


def truth_record(*, run_id: str, number: int, spec, fleet: Fleet, host: int, gpus, job: str | None,
                 rank: int | None, start_ts: float, nccl: bool, part: int | None = None,
                 down: Sequence[int] = (), interval: float = 10.0) -> dict:
    """The InjectedFault dict (schemas/analytics.py) of injection `number`; `nccl`: the run publishes NCCL records.
    `part`: the host's place in a whole rack's injection, which has one record per host (fault id `<id>.<part>`);
    `down`: the hosts a host_down takes away (the target, or its whole rack); `interval`: between samples."""
    ranked = nccl and job is not None
    expected, hardware = expected_tokens(spec, fleet, ranked, stalled=nccl and stalls_job(spec, fleet, job, down),
                                         interval=interval, busy=job is not None)
    params = {k: float(v) for k, v in spec.model_dump(exclude=COMMON_FIELDS).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if spec.kind in ("fabric_down", "nvlink_inactive") and getattr(spec, "whole_rack", False):
        params["domain_trays"] = float(len(down))  # one incident: its trays wait for the domain's one repair
    if spec.kind == "ecc_ramp":  # when the trend rule can call it a climb: a run that ends sooner cannot expect it
        seen = ramp_suspect_at(spec, interval)
        params["suspect_after_s"] = (seen - spec.at) if seen is not None else spec.lead_s
    return {
        "run_id": run_id, "fault_id": f"{run_id}-{number:03d}" + ("" if part is None else f".{part:03d}"),
        "kind": truth_kind(spec), "cause": spec.cause,
        "host": fleet.hosts[host], "rack": fleet.racks[host],
        "gpu_index": int(gpus[0] % GPUS_PER_HOST) if len(gpus) == 1 else None,
        "job": job, "rank": rank, "ts": start_ts + spec.at,
        "end_ts": None if spec.duration is None else start_ts + spec.end,
        "hardware": spec.hardware if spec.hardware is not None else hardware,
        "expected": spec.expect if spec.expect is not None else expected,
        "allowed": [] if spec.expect is not None else allowed_tokens(spec, fleet, ranked, interval),
        "params": params,
    }


def allowed_tokens(spec, fleet: Fleet, ranked: bool, interval: float = 10.0) -> list[str]:
    """What a fault in a band where timing decides may raise without it being expected or false: a slow rank
    between transient and a straggler (straggler_outcome "either"), thermal or power slowness between
    STRAGGLER_TRANSIENT_S and STRAGGLER_MIN_S, a host silent between SILENCE_TRANSIENT_S and SILENCE_MIN_S, a
    throttling sensor flap between the recurring-problems policy's bands (flap_outcome "either"), a power cap shorter
    than a sample interval."""
    if spec.kind == "slow_rank" and ranked and straggler_outcome(spec) == "either":
        return ["straggler"]
    if spec.kind == "power_cap" and power_limit_reduced(spec, fleet) and not lasts(spec, interval):
        return [POWER_LIMIT_REDUCED]  # shorter than a sample interval: seen if a sample falls inside it
    if spec.kind in SLOWS_RANK and ranked and lasts(spec, STRAGGLER_TRANSIENT_S) and not lasts(spec, STRAGGLER_MIN_S):
        return ["straggler"]
    if (spec.kind == "host_down" and not (spec.announced or spec.whole_rack) and spec.duration is not None
            and SILENCE_TRANSIENT_S < spec.duration < SILENCE_MIN_S):
        return ["fault:host_silent", "bin:reboot", "drain"]
    if spec.kind == "sensor_flap" and spec.high_c >= fleet.device.gpu_max_op_temp_c \
            and flap_outcome(spec, interval) == "either":
        return ["drain"]
    if spec.kind == "ecc_flood":  # near the flood limit noise decides; a flood that starts is a climb as well (the
        # trend rule's suspect), unless its first errors are the first the GPU ever counted (nothing to climb from)
        near = list(EXPECTED["ecc_flood"]) if gpu_link_outcome(spec, interval) == "either" else []
        return near + (list(EXPECTED["ecc_ramp"]) if spec.rate_per_s * 3600 >= TREND_MIN_PER_H else [])
    if spec.kind == "ecc_ramp":  # the failure, should the repair come after it; the suspect, near the rule's edge
        return [*RAMP_FAILS[spec.fails_with], *(EXPECTED["ecc_ramp"] if gpu_link_outcome(spec, interval) == "either"
                                                else []), "drain"]
    return []
