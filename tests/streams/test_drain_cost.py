"""What a drain costs (streams/lifecycle/cost.py): the job it stops, the GPUs it idles, the GPU-hours at stake."""

from __future__ import annotations

import orjson

from schemas.topics import FAULTS, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET, SAMPLES, XID
from streams import registry
from streams.lifecycle.cost import drain_cost
from streams.lifecycle.rules import LifecycleConfig
from streams.runtime.offline import offline_steps
from streams.runtime.spec import Record
from streams.settings import streams_settings
from tests.streams.helpers import gpu, sample

CFG = LifecycleConfig()
JOB = {f"h{i}": 8.0 for i in range(64)}  # a 512-GPU job on 64 hosts


def test_a_drain_at_once_stops_the_job_and_puts_its_restart_and_lost_work_at_stake():
    cost = drain_cost("reset", "immediate", 8.0, "llama", JOB, CFG)
    # 512 GPUs x (600 s restart + 1,800 s, half a checkpoint interval) = 341.3; 8 GPUs x 0.5 h of reset = 4
    assert (cost["job_gpus"], cost["ranks_stopped"], cost["gpus_idled"]) == ("512", "8", "512")
    assert (cost["gpu_hours_job"], cost["gpu_hours_repair"], cost["gpu_hours"]) == ("341.3", "4.0", "345.3")
    assert cost["summary"] == ("stops llama (512 GPUs on 64 hosts, 8 ranks here): ~345 GPU-hours at stake (341 of "
                               "the job's restart and lost work, 4 of reset)")


def test_a_drain_after_the_job_stops_nothing_and_costs_only_the_repair():
    cost = drain_cost("inspect", "after_jobs", 8.0, "llama", JOB, CFG)
    assert (cost["ranks_stopped"], cost["gpus_idled"], cost["gpu_hours_job"], cost["gpu_hours"]) == (
        "0", "8", "0.0", "192.0")
    assert cost["gpu_hours_saved"] == "341.3"  # what stopping the 512-GPU job at once would have cost it
    assert cost["summary"].startswith("waits for llama to finish (512 GPUs)")


def test_an_idle_node_costs_its_repair_alone_and_the_repair_times_are_settings():
    cfg = LifecycleConfig(repair_hours={"reset": 0.25, "reboot": 2.0, "inspect": 24.0, "replace": 72.0})
    cost = drain_cost("reboot", "immediate", 4.0, None, {}, cfg)
    assert (cost["job"], cost["job_hosts"], cost["gpus_idled"], cost["gpu_hours"]) == ("", "0", "4", "8.0")
    assert cost["summary"] == "no job stopped: ~8 GPU-hours at stake (4 GPUs for 2 h of reboot)"


def test_a_fault_read_before_the_node_s_first_health_row_still_costs_its_job():
    """At start-up a node's fault may reach the lifecycle before any health row naming its job: the fault-bin stage
    puts the job its samples name on the fault, and the node's job reaches the fleet step before its proposal."""
    [fault_bins] = offline_steps([registry.STAGES["fault_bins"]], streams_settings(None))
    node, fleet = offline_steps([registry.STAGES["lifecycle"]], streams_settings(None))
    value = sample("h1", 1_000.0, [gpu(i, 60.0) for i in range(8)])
    value["job"] = "job-7"
    fault_bins.run([Record("sample", value, "h1", SAMPLES.name, 0, 0, 0)])
    xid = {"host": "h1", "ts": 1_001.0, "code": 79, "gpu_index": 3, "message": "GPU has fallen off the bus."}
    [emit] = fault_bins.run([Record("xid", XID.check(xid), "h1", XID.name, 0, 1, 0)])
    fault = orjson.loads(emit.value)
    assert fault["evidence"]["job"] == "job-7"
    to_fleet = [orjson.loads(e.value) for e in node.run([Record("fault", fault, "h1", FAULTS.name, 0, 0, 0)])
                if e.to is LIFECYCLE_FLEET]
    assert [r["kind"] for r in to_fleet] == ["job", "tick", "drain"] and to_fleet[0]["job"] == "job-7"
    [decision] = [orjson.loads(e.value) for e in fleet.run([Record("fleet", r, "fleet", LIFECYCLE_FLEET.name, 0, k, 0)
                                                            for k, r in enumerate(to_fleet)])
                  if e.to is LIFECYCLE_DECISIONS]
    assert decision["cost"]["job"] == "job-7" and decision["admitted"] is True
