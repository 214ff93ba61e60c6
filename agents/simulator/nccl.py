"""Per-rank NCCL timings of synchronous jobs: compute before each collective, and the wait inside it."""

from __future__ import annotations

import numpy as np

from agents.simulator.fleet import Fleet, Job
from agents.simulator.gpu_state import diurnal

COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather")
MESSAGE_BYTES = (256 << 20, 512 << 20, 1 << 30)
INTRA_NODE_BUSBW_GBS, INTER_NODE_BUSBW_GBS = 360.0, 45.0  # NVLink vs one 400G NIC per GPU
COMPUTE_CV = 0.015  # natural per-rank compute noise (ALGORITHMS.md §6)


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: AllReduce 2(n-1)/n, ReduceScatter/AllGather (n-1)/n."""
    return 2.0 * (ranks - 1) / ranks if collective == "AllReduce" else (ranks - 1) / ranks


class NcclModel:
    """Per job: a base compute time, a message size and a collective; per rank: a small persistent offset."""

    def __init__(self, fleet: Fleet, rng: np.random.Generator):
        self.fleet, self.rng = fleet, rng
        self.seq = np.zeros(len(fleet.jobs), dtype=np.int64)
        self.ranks: list[np.ndarray] = []  # global GPU index of each rank
        self.base_compute_us, self.bytes, self.collective, self.base_coll_us, self.rank_bias = [], [], [], [], []
        for job in fleet.jobs:
            gpus = np.array([fleet.gpu_of_rank(job, r) for r in range(job.world_size)])
            self.ranks.append(gpus)
            self.base_compute_us.append(float(rng.uniform(600_000, 850_000)))
            size = int(MESSAGE_BYTES[int(rng.integers(len(MESSAGE_BYTES)))])
            coll = COLLECTIVES[int(rng.integers(len(COLLECTIVES)))]
            self.bytes.append(size)
            self.collective.append(coll)
            bw = INTRA_NODE_BUSBW_GBS if len(job.hosts) == 1 else INTER_NODE_BUSBW_GBS
            self.base_coll_us.append(size * busbw_factor(coll, job.world_size) / (bw * 1e9) * 1e6)
            self.rank_bias.append(rng.normal(0.0, 0.003, job.world_size))

    def job_records(self, job: Job, start_ts: float, slowdown: np.ndarray, congestion: float = 1.0) -> list[dict]:
        """The job's next collective, starting its step at `start_ts`: one NcclStep dict per host (its ranks inside).

        `slowdown` is the per-GPU factor on compute time (clock throttling, injected slow ranks); `congestion`
        multiplies the transfer, which every rank of a ring shares. Every rank leaves the collective together,
        so rank r waits max(compute) - compute_r.
        """
        j, rng = job.index, self.rng
        gpus = self.ranks[j]
        noise = rng.lognormal(-0.5 * COMPUTE_CV ** 2, COMPUTE_CV, gpus.size)
        compute = (self.base_compute_us[j] * (1.0 + 0.01 * diurnal(start_ts)) * (1.0 + self.rank_bias[j])
                   * noise * slowdown[gpus])
        transfer = self.base_coll_us[j] * rng.lognormal(0.0, 0.03) * congestion
        collective = transfer + (compute.max() - compute) + rng.exponential(40.0, gpus.size)
        seq = int(self.seq[j])
        self.seq[j] += 1
        hosts, coll, size, world = self.fleet.hosts, self.collective[j], self.bytes[j], job.world_size
        starts = (start_ts + compute / 1e6).tolist()
        host_idx = (gpus // 8).tolist()
        index = (gpus % 8).tolist()
        steps: dict[int, dict] = {}  # host index -> its ranks' NcclStep, as an agent on that host would publish it
        for r, (h, i, t, c, w) in enumerate(zip(host_idx, index, starts, np.round(compute, 1).tolist(),
                                                 np.round(collective, 1).tolist())):
            step = steps.get(h)
            if step is None:
                steps[h] = step = {"job": job.name, "world_size": world, "host": hosts[h], "collective": coll,
                                   "seq": seq, "bytes": size, "source": "simulator", "ranks": []}
            step["ranks"].append({"rank": r, "gpu_index": i, "ts": t, "compute_us": c, "collective_us": w})
        return list(steps.values())

    def records(self, start_ts: float, slowdown: np.ndarray, running: np.ndarray,
                transfer_factor: np.ndarray) -> list[dict]:
        """Records of every running job for one collective step; a job with any rank down emits nothing.

        A slow link on any of a job's hosts slows its whole ring, so the job takes its ranks' largest factor.
        """
        out: list[dict] = []
        for job in self.fleet.jobs:
            ranks = self.ranks[job.index]
            if running[ranks].all():
                out.extend(self.job_records(job, start_ts, slowdown, float(transfer_factor[ranks].max())))
        return out
