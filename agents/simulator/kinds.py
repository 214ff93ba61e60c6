"""The fault kinds a scenario can inject, as pydantic models: where each hits, for how long, and its parameters."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

SHUTDOWN_TEMP_C = 92.0


class _Fault(BaseModel):
    """Fields every injection has: when (seconds after the run's start), for how long, where, and its truth labels."""

    model_config = ConfigDict(extra="forbid")
    # A job_crash hits a whole job, so it is the one kind that takes a job without a rank.
    job_needs_rank: ClassVar[bool] = True
    # A slow link, a down host and a crashed job are a host's or job's, never one GPU's.
    takes_gpu: ClassVar[bool] = True

    at: float = Field(ge=0, description="seconds of simulated time after the run's start")
    duration: float | None = Field(default=None, gt=0, description="seconds; omitted = until the run ends")
    host: int | str | None = Field(default=None, description="host index or hostname")
    gpu: int | None = Field(default=None, ge=0, le=7, description="GPU index on the host; omitted = every GPU")
    job: int | str | None = Field(default=None, description="job index or name (with rank)")
    rank: int | None = Field(default=None, ge=0)
    hardware: bool | None = Field(default=None, description="override the ground truth's hardware flag")
    cause: str = Field(default="", description="label copied to the ground truth (e.g. the root cause it models)")
    expect: list[str] | None = Field(default=None, description="override the ground truth's expected tokens")
    note: str = ""

    @model_validator(mode="after")
    def _one_target(self):
        by_host, by_job = self.host is not None, self.job is not None
        if by_host == by_job:
            raise ValueError("give exactly one target: host (with optional gpu) or job with rank")
        if by_job and self.rank is None and self.job_needs_rank:
            raise ValueError("rank is required with job")
        if by_host and self.rank is not None:
            raise ValueError("rank goes with job, not host")
        if by_job and self.gpu is not None:
            raise ValueError("gpu goes with host, not job")
        if self.gpu is not None and not self.takes_gpu:
            raise ValueError("gpu: this kind hits the whole host, leave gpu out")
        return self

    @property
    def end(self) -> float:
        return float("inf") if self.duration is None else self.at + self.duration


COMMON_FIELDS = frozenset(_Fault.model_fields)


class XidFault(_Fault):
    kind: Literal["xid"]
    code: int = Field(ge=1, le=65535)
    message: str | None = Field(default=None, description="text after 'NN, '; default: a real line of that code")
    count: int = Field(default=1, ge=1, le=10000, description="how many lines (a storm when > 1)")
    every: float = Field(default=1.0, gt=0, description="seconds between repeated lines")
    caused_by: int | None = Field(default=None, ge=1, description="adds 'caused by previous Xid N'")
    crash_job: bool = Field(default=False, description="the GPU's job stops its NCCL records while active")


class ThermalRunaway(_Fault):
    kind: Literal["thermal_runaway"]
    peak_c: float = Field(default=91.0, gt=40, lt=SHUTDOWN_TEMP_C, description="temperature the GPU climbs to")
    ramp_s: float = Field(default=15.0, ge=0, description="seconds from normal to peak")


class PowerCap(_Fault):
    kind: Literal["power_cap"]
    cap_w: float = Field(default=400.0, ge=100, le=700, description="enforced power limit while active")


class SlowRank(_Fault):
    kind: Literal["slow_rank"]
    slowdown_pct: float = Field(gt=0, le=500, description="compute time grows by this percentage")


class EccDbe(_Fault):
    kind: Literal["ecc_dbe"]


class RowRemapFailure(_Fault):
    kind: Literal["row_remap_failure"]


class NvlinkCrc(_Fault):
    kind: Literal["nvlink_crc"]
    rate_per_s: float = Field(default=50.0, gt=0, le=1e6, description="mean CRC errors added per second")


class PcieReplay(_Fault):
    kind: Literal["pcie_replay"]
    rate_per_s: float = Field(default=5.0, gt=0, le=1e6, description="mean PCIe replays added per second")


class EccFlood(_Fault):
    """Corrected ECC errors pour in (a failing HBM stack) while NVML and DCGM still call the GPU healthy: DCGM issue
    313's GB200 counted 54.7 billion, rising ~17,700 a second."""

    kind: Literal["ecc_flood"]
    rate_per_s: float = Field(default=17_700.0, gt=0, le=1e7, description="mean corrected errors added per second")


class EccRamp(_Fault):
    """A GPU's memory degrading: corrected ECC errors climb exponentially from `start_per_h` to `end_per_h` over
    `lead_s`, then it fails hard (`fails_with`: an uncorrectable error, Xid 48, or a row that cannot be remapped, Xid
    64; `none`: it only keeps climbing). The gray failure a level threshold misses until it is too late."""

    kind: Literal["ecc_ramp"]
    lead_s: float = Field(default=5400.0, gt=0, le=7 * 86400, description="seconds from the first climb to the failure")
    start_per_h: float = Field(default=6.0, gt=0, le=1e6, description="corrected errors an hour at the start")
    end_per_h: float = Field(default=2000.0, gt=0, le=1e7, description="corrected errors an hour at the failure")
    fails_with: Literal["dbe", "row_remap_failure", "none"] = "dbe"

    @model_validator(mode="after")
    def _climbs(self):
        if self.end_per_h <= self.start_per_h:
            raise ValueError("end_per_h must be above start_per_h: a ramp climbs")
        return self

    def rate_per_s(self, t: float) -> float:
        """Its corrected errors a second at `t` (seconds of the run): the climb, then the end rate."""
        share = min(1.0, max(0.0, (t - self.at) / self.lead_s))
        return self.start_per_h * (self.end_per_h / self.start_per_h) ** share / 3600.0


class PcieDowntrain(_Fault):
    """The GPU's PCIe link runs at fewer lanes or a lower generation than its slot allows (a riser, slot or card
    edge), with no Xid: NVSentinel issue 890."""

    kind: Literal["pcie_downtrain"]
    width: int | None = Field(default=8, ge=1, le=15, description="lanes meanwhile (full: 16); null = full width")
    gen: int | None = Field(default=None, ge=1, le=4, description="generation meanwhile (full: 5); null = full")

    @model_validator(mode="after")
    def _something(self):
        if self.width is None and self.gen is None:
            raise ValueError("give width or gen (or both): a link at full width and generation is no fault")
        return self


class NvlinkInactive(_Fault):
    """NVLink links of the GPU go inactive (a failed training, a bad NVSwitch tray or cable cartridge); links 0..n-1
    of its 18. gpud issue 1085: all links inactive and the GPU still reported healthy."""

    kind: Literal["nvlink_inactive"]
    links: int = Field(default=18, ge=1, le=18, description="how many links go inactive")
    whole_rack: bool = Field(default=False, description="every GPU of every host of the target's rack (a rack-scale "
                             "NVLink domain whose switch trays fail)")


class FabricDown(_Fault):
    """The GPU's fabric training fails (the host's Fabric Manager is down: NVSentinel issues 883/889, down 20 days
    unnoticed): NVML reports the fabric completed with an error; new CUDA jobs cannot start. Every GPU of the host
    unless `gpu` names one."""

    kind: Literal["fabric_down"]
    whole_rack: bool = Field(default=False, description="every host of the target's rack (a rack-scale NVLink "
                             "domain whose Fabric Manager is down)")


class GpuLost(_Fault):
    kind: Literal["gpu_lost"]


class Congestion(_Fault):
    kind: Literal["congestion"]
    takes_gpu: ClassVar[bool] = False
    factor: float = Field(default=3.0, gt=1, le=100, description="collective transfer time of the host's jobs x this")


class SensorFlap(_Fault):
    kind: Literal["sensor_flap"]
    low_c: float = Field(gt=0, lt=SHUTDOWN_TEMP_C, description="reading of the low part of each period")
    high_c: float = Field(gt=0, lt=SHUTDOWN_TEMP_C, description="reading of the high part of each period (first)")
    period_s: float = Field(default=180.0, gt=0, description="seconds of one high + low cycle")
    duty: float = Field(default=0.5, gt=0, lt=1, description="share of each period at the high reading")

    @model_validator(mode="after")
    def _ordered(self):
        if self.low_c >= self.high_c:
            raise ValueError("low_c must be below high_c")
        return self


class HostDown(_Fault):
    """The host goes away: no samples, status records, XID lines or NCCL records until it is back (`duration`)."""

    kind: Literal["host_down"]
    takes_gpu: ClassVar[bool] = False
    announced: bool = Field(default=False, description="the agent is stopped in order first (planned maintenance): "
                                                       "its last status says 'stopping'; false = it just goes silent")
    whole_rack: bool = Field(default=False, description="every host of the target's rack goes (a rack switch dies)")


class MonitorBroken(_Fault):
    """The host's sample collector fails (NVML answers Unknown Error): no samples, but the agent still publishes its
    status, naming the failing collector; the GPUs and their job run on."""

    kind: Literal["monitor_broken"]
    takes_gpu: ClassVar[bool] = False
    error: str = Field(default="NVMLError_Unknown: Unknown Error", min_length=1, max_length=512,
                       description="the error the status names for the nvml collector")


class _PortFault(_Fault):
    """A fault of one of the host's InfiniBand ports (agents/simulator/network.py: mlx5_<port>, one per GPU)."""

    takes_gpu: ClassVar[bool] = False
    port: int = Field(default=0, ge=0, le=7, description="the port's device: mlx5_<port>")


class LinkFlap(_PortFault):
    """The port's link drops and retrains `flaps` times, `every` seconds apart (a loose or failing cable)."""

    kind: Literal["link_flap"]
    flaps: int = Field(default=3, ge=1, le=1000)
    every: float = Field(default=60.0, gt=0, description="seconds between drops")
    errors_per_s: float = Field(default=2.0, ge=0, le=1e6,
                                description="symbol errors the bad link adds per second (no noise), from its first drop "
                                            "to its last")


class LinkDown(_PortFault):
    """The port's link goes down and stays down until `duration` ends or the host is repaired (a dead cable,
    transceiver or switch port)."""

    kind: Literal["link_down"]


class LinkDegraded(_PortFault):
    """The port's link runs at a lower rate (a lane lost, a speed fallback) until `duration` ends or repair."""

    kind: Literal["link_degraded"]
    rate_gbps: float = Field(default=200.0, gt=0, lt=400, description="its rate meanwhile (full: 400)")


class NicDown(_PortFault):
    """The port's NIC firmware fails (mlx5 health compromised in the kernel log) and its link goes down until the
    host is rebooted (repaired) or `duration` ends."""

    kind: Literal["nic_down"]


class SsdError(_Fault):
    """The host's NVMe disk fails: command timeouts, the controller down and removed, I/O errors, and the
    filesystem on it going read-only, in the kernel log. The host and its GPUs run on."""

    kind: Literal["ssd_error"]
    takes_gpu: ClassVar[bool] = False
    device: str = Field(default="nvme0", pattern=r"^nvme\d{1,3}$")


class MachineCheck(_Fault):
    """An uncorrected machine check on the host's CPU or memory: the kernel logs the bank's status and the EDAC
    driver the failed DIMM; the host and its GPUs run on (the page was poisoned), until someone runs the vendor's
    diagnostics."""

    kind: Literal["machine_check"]
    takes_gpu: ClassVar[bool] = False


class FsShutdown(_Fault):
    """The host's XFS filesystem shuts itself down on a log write that failed, with no word from its disk: jobs can no
    longer write checkpoints or logs there."""

    kind: Literal["fs_shutdown"]
    takes_gpu: ClassVar[bool] = False
    device: str = Field(default="md0", pattern=r"^[a-z][a-z0-9-]{1,15}$", description="the filesystem's block device")


class CableError(_PortFault):
    """The port's cable or transceiver module reports an error (mlx5 'Port module event[error]'); its link runs on
    until someone reseats or replaces it."""

    kind: Literal["cable_error"]


class CableAbsent(_PortFault):
    """A port that never had a cable: down from the host's boot, and the NIC says 'Cable unplugged' at every boot.
    Nothing to find: a run starts with it (at 0)."""

    kind: Literal["cable_absent"]

    @model_validator(mode="after")
    def _from_boot(self):
        if self.at != 0:
            raise ValueError("cable_absent is a port never cabled since boot: at must be 0 (a cable pulled later is "
                             "link_down)")
        return self


class JobCrash(_Fault):
    kind: Literal["job_crash"]
    job_needs_rank: ClassVar[bool] = False
    takes_gpu: ClassVar[bool] = False


class PowerSurge(_Fault):
    kind: Literal["power_surge"]
    power_w: float | None = Field(default=None, ge=100, le=700,
                                  description="power each GPU draws; omitted = 0.97 x its power limit")


FaultSpec = Annotated[
    Union[XidFault, ThermalRunaway, PowerCap, SlowRank, EccDbe, RowRemapFailure, NvlinkCrc, PcieReplay, GpuLost,
          EccFlood, EccRamp, PcieDowntrain, NvlinkInactive, FabricDown,
          Congestion, SensorFlap, HostDown, JobCrash, PowerSurge, MonitorBroken, LinkFlap, LinkDown, LinkDegraded,
          NicDown, SsdError, MachineCheck, FsShutdown, CableError, CableAbsent],
    Field(discriminator="kind"),
]
FAULT_ADAPTER: TypeAdapter = TypeAdapter(FaultSpec)
KINDS = ("xid", "thermal_runaway", "power_cap", "slow_rank", "ecc_dbe", "row_remap_failure", "nvlink_crc",
         "pcie_replay", "gpu_lost", "congestion", "sensor_flap", "host_down", "job_crash", "power_surge",
         "monitor_broken", "link_flap", "link_down", "link_degraded", "nic_down", "ssd_error", "machine_check",
         "fs_shutdown", "cable_error", "cable_absent", "ecc_flood", "ecc_ramp", "pcie_downtrain", "nvlink_inactive", "fabric_down")
PORT_KINDS = frozenset({"link_flap", "link_down", "link_degraded", "nic_down", "cable_error", "cable_absent"})
HOST_LOG_KINDS = frozenset({"nic_down", "ssd_error", "machine_check", "fs_shutdown", "cable_error", "cable_absent"})
# generated ones get no random GPU
HOST_WIDE = frozenset({"congestion", "host_down", "job_crash", "power_surge", "monitor_broken", "ssd_error",
                       "machine_check", "fs_shutdown",
                       *PORT_KINDS})
NEEDS_JOB = frozenset({"slow_rank", "job_crash"})  # only hosts that run a job can take these
