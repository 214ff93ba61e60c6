"""What a drain costs, estimated where every node's job and GPUs are known (the lifecycle's fleet step), so that each
drain request says what it stops before a bot acts on it: the job and its ranks on the node, the GPUs idled, and the
GPU-hours at stake from the job's size and the repair's expected time (LifecycleConfig's repair_hours, job_restart_s,
checkpoint_interval_s: [ours] until a fleet's own repair times replace them)."""

from __future__ import annotations

from collections.abc import Mapping

from streams.lifecycle.rules import LifecycleConfig


def drain_cost(repair: str, mode: str, node_gpus: float, job: str | None, job_gpus: Mapping[str, float],
               cfg: LifecycleConfig) -> dict[str, str]:
    """The blast radius of draining a node of `node_gpus` GPUs for `repair`, `mode` 'immediate' (its job stops now) or
    'after_jobs' (it takes no new work and is drained once its job is done); `job_gpus`: installed GPUs of each host
    running `job`, this node's included. Strings, as a drain request's evidence carries them."""
    repair_h = cfg.repair_hours.get(repair, max(cfg.repair_hours.values(), default=0.0))
    gpus = sum(job_gpus.values()) if job else 0.0
    stops = job is not None and mode == "immediate"
    lost_h = (cfg.job_restart_s + cfg.checkpoint_interval_s / 2.0) / 3600.0
    at_repair, at_job = node_gpus * repair_h, (gpus * lost_h if stops else 0.0)
    saved = gpus * lost_h if job is not None and not stops else 0.0  # what stopping the job now would have cost
    total = at_repair + at_job
    if stops:
        what = (f"stops {job} ({gpus:g} GPUs on {len(job_gpus)} hosts, {node_gpus:g} ranks here): ~{total:,.0f} "
                f"GPU-hours at stake ({at_job:,.0f} of the job's restart and lost work, {at_repair:,.0f} of {repair})")
    elif job is not None:
        what = (f"waits for {job} to finish ({gpus:g} GPUs): ~{total:,.0f} GPU-hours at stake, all of the {repair} "
                f"({node_gpus:g} GPUs for {repair_h:g} h); ~{saved:,.0f} saved against stopping the job now")
    else:
        what = f"no job stopped: ~{total:,.0f} GPU-hours at stake ({node_gpus:g} GPUs for {repair_h:g} h of {repair})"
    idled = max(gpus, node_gpus) if stops else node_gpus
    return {"job": job or "", "job_hosts": f"{len(job_gpus) if job else 0}", "job_gpus": f"{gpus:g}",
            "ranks_stopped": f"{node_gpus:g}" if stops else "0", "gpus_idled": f"{idled:g}",
            "gpu_hours": f"{total:.1f}", "gpu_hours_job": f"{at_job:.1f}", "gpu_hours_repair": f"{at_repair:.1f}",
            "gpu_hours_saved": f"{saved:.1f}",
            "basis": (f"{repair} {repair_h:g} h; a stopped job loses {cfg.job_restart_s:g} s of restart and half of a "
                      f"{cfg.checkpoint_interval_s:g} s checkpoint interval"),
            "summary": what}
