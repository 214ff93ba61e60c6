"""Applies a scenario tick by tick: per-GPU effects, the XID lines each injection logs, and its ground truth."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agents.simulator import xid
from agents.simulator.fleet import GPUS_PER_HOST, Fleet
from agents.simulator.gpu_state import Effects, GpuState
from agents.simulator import host_log
from agents.simulator.kinds import HOST_LOG_KINDS, NEEDS_JOB, PORT_KINDS, XidFault
from agents.simulator.scenario import Scenario
from agents.simulator.truth import truth_record
from core.errors import ConfigError

SURGE_SHARE = 0.97  # a power surge's default draw, as a share of the power limit
# kinds that last until the host's repair (when they have no duration): the repair is what mends them
REPAIRED = frozenset({*PORT_KINDS, "ssd_error", "ecc_flood", "ecc_ramp", "pcie_downtrain", "nvlink_inactive",
                      "fabric_down"})


@dataclass
class Injection:
    """One scenario entry resolved against the fleet."""

    number: int
    spec: object
    host: int
    gpus: np.ndarray  # global GPU indices hit
    job: str | None
    rank: int | None
    hosts: list[int] = field(default_factory=list)  # every host it takes down (a whole rack's); else [host]
    started: bool = False
    ended: bool = False
    start_temp: np.ndarray | None = None


def _job(fleet: Fleet, ref: int | str, where: str):
    names = [j.name for j in fleet.jobs]
    if isinstance(ref, str) and ref in names:
        return fleet.jobs[names.index(ref)]
    if isinstance(ref, int) and 0 <= ref < len(fleet.jobs):
        return fleet.jobs[ref]
    raise ConfigError(f"scenario: {where}.job: no job {ref!r} (fleet has {len(fleet.jobs)} jobs)")


def _host(fleet: Fleet, ref: int | str, where: str) -> int:
    if isinstance(ref, str):
        if ref not in fleet.hosts:
            raise ConfigError(f"scenario: {where}.host: no host named {ref!r}")
        return fleet.hosts.index(ref)
    if not 0 <= ref < fleet.n_hosts:
        raise ConfigError(f"scenario: {where}.host: index {ref} outside the fleet's {fleet.n_hosts} hosts")
    return ref


def _resolve(fleet: Fleet, number: int, spec) -> Injection:
    inj = _resolve_target(fleet, number, spec)
    if getattr(spec, "whole_rack", False):  # every host of the target's rack, the target first
        rack = fleet.racks[inj.host]
        inj.hosts = [inj.host] + [h for h in range(fleet.n_hosts) if fleet.racks[h] == rack and h != inj.host]
        inj.gpus = np.array([h * GPUS_PER_HOST + i for h in inj.hosts for i in range(GPUS_PER_HOST)])
        inj.rank = None
    return inj


def _resolve_target(fleet: Fleet, number: int, spec) -> Injection:
    where = f"faults.{number}"
    if spec.job is not None:
        job = _job(fleet, spec.job, where)
        if spec.rank is None:  # a whole job (job_crash): it is named by its first host
            gpus = np.arange(GPUS_PER_HOST) + job.hosts[0] * GPUS_PER_HOST
            return Injection(number, spec, job.hosts[0], gpus, job.name, None, [job.hosts[0]])
        if spec.rank >= job.world_size:
            raise ConfigError(f"scenario: {where}.rank: {spec.rank} >= world size {job.world_size} of {job.name}")
        gpu = fleet.gpu_of_rank(job, spec.rank)
        return Injection(number, spec, gpu // GPUS_PER_HOST, np.array([gpu]), job.name, spec.rank,
                         [gpu // GPUS_PER_HOST])
    host = _host(fleet, spec.host, where)
    indices = range(GPUS_PER_HOST) if spec.gpu is None else [spec.gpu]
    gpus = np.array([host * GPUS_PER_HOST + i for i in indices])
    placed = fleet.rank_of(int(gpus[0]))
    if spec.kind in NEEDS_JOB and placed is None:
        raise ConfigError(f"scenario: {where}.host: {fleet.hosts[host]} runs no job, so it has no {spec.kind} "
                          "to inject")
    job, rank = (placed[0].name, placed[1]) if placed else (None, None)
    return Injection(number, spec, host, gpus, job, rank if gpus.size == 1 else None, [host])


class FaultInjector:
    """Holds the resolved injections; `apply` returns this tick's effects, XID events and truth records."""

    def __init__(self, fleet: Fleet, scenario: Scenario, state: GpuState, rng: np.random.Generator, *,
                 run_id: str, start_ts: float, nccl: bool, interval: float = 10.0):
        self.fleet, self.scenario, self.state, self.rng = fleet, scenario, state, rng
        self.run_id, self.start_ts, self.nccl, self.interval = run_id, start_ts, nccl, interval
        self.injections = [_resolve(fleet, i, spec) for i, spec in enumerate(scenario.faults)]
        self.host_lines: list[dict] = []  # HostEvent dicts of started faults not yet taken, in time order
        self.rebooted: list[int] = []  # hosts repaired since the last take_rebooted(): their port counters restart

    def take_host_lines(self, until_ts: float) -> list[dict]:
        """The host lines logged at or before `until_ts`, once each."""
        due = [e for e in self.host_lines if e["ts"] <= until_ts]
        self.host_lines = [e for e in self.host_lines if e["ts"] > until_ts]
        return due

    def take_rebooted(self) -> list[int]:
        out, self.rebooted = self.rebooted, []
        return out

    def apply(self, t_prev: float, t_now: float) -> tuple[Effects, list[dict], list[dict]]:
        """Effects for the tick at relative time t_now; events that fall in (t_prev, t_now] fire now."""
        fx, events, truth = Effects.healthy(self.fleet), [], []
        for inj in self.injections:
            spec = inj.spec
            if not inj.started and spec.at <= t_now:
                inj.started = True
                truth.extend(self._truth(inj))
                events.extend(self._start(inj))
                if getattr(spec, "announced", False):
                    fx.goodbye[inj.hosts] = True
            if isinstance(spec, XidFault) and inj.started:
                events.extend(self._xid_repeats(inj, t_prev, t_now))
            if spec.kind == "ecc_ramp" and inj.started and not inj.ended and t_prev < spec.at + spec.lead_s <= t_now:
                events.extend(self._fail_hard(inj))
            if inj.started and not inj.ended and t_now >= spec.end:
                inj.ended = True
                self._end(inj)
            if inj.started and not inj.ended:
                self._effect(inj, fx, t_now)
                if spec.kind == "link_flap":
                    self._flaps(inj, fx, t_prev, t_now)
        events.sort(key=lambda e: e["ts"])
        return fx, events, truth

    def repaired(self, host: int) -> None:
        """A repair of `host` is done: a host that went down for good (no duration) is back from the next tick, as
        the truth's usable compute has it (score._back_at). One down for a while stays down to its end; a whole
        rack's switch is no host's repair."""
        for inj in self.injections:
            spec = inj.spec
            if (inj.started and not inj.ended and spec.kind == "host_down" and spec.duration is None
                    and not spec.whole_rack and inj.host == host):
                inj.ended = True
            # a repair reseats or replaces what a port fault names, resets the NIC, replaces the disk; it reseats the
            # GPU, trains its links again, restarts the Fabric Manager, replaces the failing memory; a rack-scale
            # NVLink domain's (whole_rack) comes back with the first of its trays' repairs (its shared part's)
            if (inj.started and not inj.ended and spec.kind in REPAIRED and spec.duration is None
                    and host in inj.hosts):
                inj.ended = True
        self.rebooted.append(host)

    def _truth(self, inj: Injection) -> list[dict]:
        """The injection's truth record; a whole rack's has one per host (each with its own job), parts numbered."""
        f, whole = self.fleet, getattr(inj.spec, "whole_rack", False)
        out = []
        for part, h in enumerate(inj.hosts):
            gpus = inj.gpus if not whole else np.arange(GPUS_PER_HOST) + h * GPUS_PER_HOST
            job = inj.job if not whole else f.job_name_of_host(h)
            out.append(truth_record(run_id=self.run_id, number=inj.number, spec=inj.spec, fleet=f, host=h, gpus=gpus,
                                    job=job, rank=inj.rank, start_ts=self.start_ts, nccl=self.nccl,
                                    part=part if whole else None, down=inj.hosts, interval=self.interval))
        return out

    def _event(self, gpu: int, ts: float, code: int, message: str | None = None, caused_by: int | None = None) -> dict:
        host, index = divmod(gpu, GPUS_PER_HOST)
        f = self.fleet
        return xid.xid_event(ts=ts, host=f.hosts[host], rack=f.racks[host], cluster=f.cluster, gpu_index=index,
                             gpu_uuid=f.uuids[host][index], pci_bus_id=f.pci_ids[index], code=code,
                             message=message or xid.message_for(code, self.rng), caused_by=caused_by)

    def _log(self, gpu: int, ts: float, code: int, message: str | None = None,
             caused_by: int | None = None) -> list[dict]:
        """The Xid line, and the Xid 154 line when the code changes the GPU's recovery action."""
        s = self.state
        out = [self._event(gpu, ts, code, message, caused_by)]
        s.last_xid[gpu] = code
        new = xid.RECOVERY_ACTION.get(code)
        if new is not None and new != s.recovery_action[gpu]:
            old = int(s.recovery_action[gpu])
            s.recovery_action[gpu] = new
            out.append(self._event(gpu, ts + 0.001, 154, xid.recovery_message(old, new)))
        return out

    def _start(self, inj: Injection) -> list[dict]:
        spec, s, kind = inj.spec, self.state, inj.spec.kind
        ts = self.start_ts + spec.at
        out: list[dict] = []
        for g in inj.gpus.tolist():
            if kind == "xid":
                out += self._log(g, ts, spec.code, spec.message, spec.caused_by)
            elif kind == "ecc_dbe":
                out += self._dbe(g, ts)
            elif kind == "row_remap_failure":
                out += self._remap_failure(g, ts)
            elif kind == "gpu_lost":
                out += self._log(g, ts, 79)
        if kind == "thermal_runaway":
            inj.start_temp = s.temp[inj.gpus].copy()
        if kind in HOST_LOG_KINDS:
            f = self.fleet
            self.host_lines = sorted([*self.host_lines, *host_log.lines(
                spec, ts, host=f.hosts[inj.host], rack=f.racks[inj.host], cluster=f.cluster)], key=lambda e: e["ts"])
        return out

    def _fail_hard(self, inj: Injection) -> list[dict]:
        """A memory ramp's end: the failure it was heading for, as ecc_dbe or row_remap_failure logs it."""
        spec, out = inj.spec, []
        ts = self.start_ts + spec.at + spec.lead_s
        for g in inj.gpus.tolist():
            if spec.fails_with == "dbe":
                out += self._dbe(g, ts)
            elif spec.fails_with == "row_remap_failure":
                out += self._remap_failure(g, ts)
        return out

    def _dbe(self, g: int, ts: float) -> list[dict]:
        """An uncorrectable ECC error: the counters, a row remap pending until reset, Xid 48 (and its 154), Xid 63."""
        s = self.state
        s.ecc_dbe_volatile[g] += 1
        s.ecc_dbe_aggregate[g] += 1
        s.remapped_uncorrectable[g] += 1
        s.row_remap_pending[g] = True
        out = self._log(g, ts, 48)
        out.append(self._event(g, ts + 0.0005, 63))
        s.last_xid[g] = 48
        return out

    def _remap_failure(self, g: int, ts: float) -> list[dict]:
        """A row that cannot be remapped (its bank had no spare row left): the flags, Xid 64 (and its 154)."""
        s = self.state
        s.remapped_uncorrectable[g] += 1
        s.row_remap_failure[g] = True
        s.remap_banks_none[g] += 1
        return self._log(g, ts, 64)

    def _flaps(self, inj: Injection, fx: Effects, t_prev: float, t_now: float) -> None:
        """The drops of a flapping link that fall in (t_prev, t_now], and the errors of the bad link meanwhile."""
        spec = inj.spec
        times = [spec.at + k * spec.every for k in range(spec.flaps)]
        fx.port_drops[inj.host, spec.port] += sum(t_prev < t <= t_now and t < spec.end for t in times)
        last = min(times[-1], spec.end)  # errors between its first and its last drop: a link that drops once is clean
        if t_prev < last:
            fx.port_errors[inj.host, spec.port] += spec.errors_per_s * (min(t_now, last) - max(t_prev, spec.at))

    def _xid_repeats(self, inj: Injection, t_prev: float, t_now: float) -> list[dict]:
        spec, out = inj.spec, []
        for m in range(1, spec.count):
            t = spec.at + m * spec.every
            if t_prev < t <= t_now and t < spec.end:
                for g in inj.gpus.tolist():
                    out += self._log(g, self.start_ts + t, spec.code, spec.message, spec.caused_by)
        return out

    def _end(self, inj: Injection) -> None:
        """What ending means: a reset activates the pending remap; a lost GPU is back after a reboot."""
        s, g = self.state, inj.gpus
        if inj.spec.kind == "ecc_dbe":
            s.row_remap_pending[g] = False
            s.recovery_action[g] = 0
        elif inj.spec.kind == "gpu_lost":
            s.recovery_action[g] = 0
            s.last_xid[g] = -1

    def _effect(self, inj: Injection, fx: Effects, t_now: float) -> None:
        spec, g, kind = inj.spec, inj.gpus, inj.spec.kind
        if kind == "thermal_runaway":
            share = 1.0 if spec.ramp_s == 0 else min(1.0, (t_now - spec.at) / spec.ramp_s)
            fx.temp_target_c[g] = inj.start_temp + (spec.peak_c + 0.4 - inj.start_temp) * share
        elif kind == "power_cap":
            fx.power_limit_w[g] = np.minimum(fx.power_limit_w[g], spec.cap_w)
        elif kind == "slow_rank":
            fx.compute_factor[g] *= 1.0 + spec.slowdown_pct / 100.0
        elif kind == "nvlink_crc":
            fx.crc_rate[g] += spec.rate_per_s
        elif kind == "pcie_replay":
            fx.pcie_rate[g] += spec.rate_per_s
        elif kind == "ecc_flood":
            fx.sbe_rate[g] += spec.rate_per_s
        elif kind == "ecc_ramp":
            fx.sbe_rate[g] += spec.rate_per_s(t_now)
        elif kind == "pcie_downtrain":
            fx.pcie_width[g] = spec.width or 0
            fx.pcie_gen[g] = spec.gen or 0
        elif kind == "nvlink_inactive":
            fx.nvlink_down[g] = np.maximum(fx.nvlink_down[g], spec.links)
        elif kind == "fabric_down":
            fx.fabric_failed[g] = True
        elif kind == "gpu_lost":
            fx.present[g] = False
        elif kind == "congestion":
            fx.transfer_factor[g] = np.maximum(fx.transfer_factor[g], spec.factor)
        elif kind == "sensor_flap":
            high = (t_now - spec.at) % spec.period_s < spec.duty * spec.period_s  # high first, then low
            fx.temp_reading_c[g] = spec.high_c if high else spec.low_c
        elif kind == "host_down":
            fx.present[g] = False
            fx.host_up[inj.hosts] = False
        elif kind == "monitor_broken":
            fx.monitor_errors[inj.host] = spec.error
        elif kind == "job_crash" or (kind == "xid" and spec.crash_job):
            fx.nccl_stopped[g] = True
        elif kind == "power_surge":
            fx.power_target_w[g] = spec.power_w or SURGE_SHARE * self.fleet.device.power_limit_w
        elif kind in ("link_down", "nic_down", "cable_absent"):
            fx.port_down[inj.host, spec.port] = True
        elif kind == "link_degraded":
            fx.port_rate[inj.host, spec.port] = min(spec.rate_gbps, np.nan_to_num(fx.port_rate[inj.host, spec.port],
                                                                                  nan=spec.rate_gbps))
