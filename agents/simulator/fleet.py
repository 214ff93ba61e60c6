"""The simulated fleet's fixed layout: hosts in racks, 8 Hopper GPUs each, and multi-host jobs with their ranks."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

GPUS_PER_HOST = 8
# PCI bus numbers of the 8 GPUs on an HGX H100/H200 baseboard (DGX H100 / XE9680 lspci order).
HGX_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
JOB_SIZES_HOSTS = (8, 16, 32, 64)
IDLE_HOST_SHARE = 0.06
CHECKPOINT_S = 3600.0  # between a job's checkpoints (LifecycleConfig.checkpoint_interval_s's default)
GOLDEN = 0.6180339887498949  # job k checkpoints at phase k * GOLDEN of the interval: jobs spread over it, seedless


@dataclass(frozen=True)
class DeviceSpec:
    """Limits and clocks one GPU model reports through NVML (REFERENCE.md §4a)."""

    model: str
    mem_total_mib: float
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    mem_clock_mhz: float
    slowdown_temp_c: float = 89.0
    shutdown_temp_c: float = 92.0
    gpu_max_op_temp_c: float = 87.0
    hbm_max_op_temp_c: float = 95.0
    # links and spare memory rows (an H100 80GB HBM3 on an HGX board, nvidia-smi -q: PCIe Gen5 x16, 18 NVLink links,
    # 2560 banks in the row remapper's histogram; the H200's bank count is not published: the H100's is used)
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlink_links: int = 18
    remap_banks: int = 2560


DEVICES = {
    "H100": DeviceSpec("NVIDIA H100 80GB HBM3", 81559.0, 700.0, 72.0, 1980.0, 345.0, 2619.0),
    "H200": DeviceSpec("NVIDIA H200", 143771.0, 700.0, 76.0, 1980.0, 345.0, 3201.0),
}


def pci_bus_id(index: int, domain: int = 0) -> str:
    """NVML's legacy bus id of GPU `index` on an HGX board, e.g. '0000:18:00.0'."""
    return f"{domain:04x}:{HGX_PCI_BUSES[index]:02x}:00.0"


def gpu_uuid(cluster: str, host: str, index: int) -> str:
    """A stable fake GPU UUID in NVML's 'GPU-8-4-4-4-12' form, derived from where the GPU sits."""
    h = hashlib.blake2b(f"{cluster}/{host}/{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class Job:
    """A synchronous training job on consecutive hosts; rank = host position * 8 + GPU index."""

    index: int
    name: str
    hosts: tuple[int, ...]
    checkpoint_s: float = CHECKPOINT_S

    @property
    def world_size(self) -> int:
        return len(self.hosts) * GPUS_PER_HOST

    @property
    def phase_s(self) -> float:
        """When in each interval (seconds from the run's start, modulo checkpoint_s) the job saves its checkpoint."""
        return (self.index * GOLDEN) % 1.0 * self.checkpoint_s

    def checkpoint_before(self, t: float) -> float:
        """The job's last checkpoint at or before `t` (seconds of the run; one before the run's start counts: the
        job was running before it)."""
        return math.floor((t - self.phase_s) / self.checkpoint_s) * self.checkpoint_s + self.phase_s

    def checkpoint_after(self, t: float) -> float:
        """The job's next checkpoint at or after `t`."""
        return math.ceil((t - self.phase_s) / self.checkpoint_s) * self.checkpoint_s + self.phase_s


@dataclass
class Fleet:
    """Names, placement and job layout of every host and GPU; GPU g lives on host g // 8 at index g % 8."""

    cluster: str
    device: DeviceSpec
    driver_version: str
    hosts: list[str]
    racks: list[str]
    jobs: list[Job]
    host_job: np.ndarray  # job index per host, -1 = no job
    uuids: list[list[str]] = field(repr=False)
    domain_hosts: int = 1  # hosts per NVLink domain (fabric clique), packed from host 0
    pci_ids: tuple[str, ...] = tuple(pci_bus_id(i) for i in range(GPUS_PER_HOST))

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    @property
    def n_gpus(self) -> int:
        return len(self.hosts) * GPUS_PER_HOST

    @property
    def gpu_job(self) -> np.ndarray:
        return np.repeat(self.host_job, GPUS_PER_HOST)

    def job_name_of_host(self, host: int) -> str | None:
        j = int(self.host_job[host])
        return self.jobs[j].name if j >= 0 else None

    def rank_of(self, gpu: int) -> tuple[Job, int] | None:
        """(job, rank) of global GPU index `gpu`, or None when its host runs no job."""
        host, index = divmod(gpu, GPUS_PER_HOST)
        j = int(self.host_job[host])
        if j < 0:
            return None
        job = self.jobs[j]
        return job, job.hosts.index(host) * GPUS_PER_HOST + index

    def gpu_of_rank(self, job: Job, rank: int) -> int:
        pos, index = divmod(rank, GPUS_PER_HOST)
        return job.hosts[pos] * GPUS_PER_HOST + index


def _place_jobs(n_hosts: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(first host, host count) of each job: power-of-two sizes packed from host 0, a few hosts left idle."""
    spans, start = [], 0
    idle_target = int(round(n_hosts * IDLE_HOST_SHARE))
    while n_hosts - start > idle_target:
        left = n_hosts - start - idle_target
        fitting = [s for s in JOB_SIZES_HOSTS if s <= left]
        size = int(rng.choice(fitting)) if fitting else left
        spans.append((start, size))
        start += size
    return spans


def _pack_jobs(n_hosts: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(first host, host count) of jobs of the given sizes, packed from host 0; the hosts left over idle."""
    if sum(sizes) > n_hosts or min(sizes, default=1) < 1:
        raise ValueError(f"jobs of {list(sizes)} hosts do not fit a fleet of {n_hosts} hosts")
    starts = np.cumsum([0, *sizes[:-1]]).tolist()
    return list(zip(starts, sizes))


def build_fleet(n_hosts: int, *, seed: int = 0, cluster: str = "sim", gpu_model: str = "H100",
                hosts_per_rack: int = 16, driver_version: str = "550.127.08",
                jobs: Sequence[int] | None = None, domain_hosts: int = 1,
                checkpoint_s: float = CHECKPOINT_S) -> Fleet:
    """Lay out `n_hosts` hosts: names gpu-node-0000.., racks rack-000.., jobs job-0000...

    `jobs` gives each job's host count (a scenario written for one 1,024-rank job); None = a seeded random layout.
    """
    if n_hosts < 1:
        raise ValueError("a fleet needs at least one host")
    if gpu_model not in DEVICES:
        raise ValueError(f"unknown gpu model {gpu_model!r}; known: {', '.join(DEVICES)}")
    rng = np.random.default_rng([seed, 0xF1EE7])
    hosts = [f"gpu-node-{i:04d}" for i in range(n_hosts)]
    racks = [f"rack-{i // hosts_per_rack:03d}" for i in range(n_hosts)]
    host_job = np.full(n_hosts, -1, dtype=np.int64)
    spans = _place_jobs(n_hosts, rng) if jobs is None else _pack_jobs(n_hosts, list(jobs))
    placed = []
    for j, (first, size) in enumerate(spans):
        placed.append(Job(j, f"job-{j:04d}", tuple(range(first, first + size)), checkpoint_s))
        host_job[first:first + size] = j
    uuids = [[gpu_uuid(cluster, h, i) for i in range(GPUS_PER_HOST)] for h in hosts]
    return Fleet(cluster, DEVICES[gpu_model], driver_version, hosts, racks, placed, host_job, uuids,
                 domain_hosts=domain_hosts)
