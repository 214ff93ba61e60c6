"""A job that crashes again and again (the application, not the hardware) drains nothing and escalates nothing,
with every GPU rule on (links, floods, trends): 2 to 20 crashes of one job, minutes to hours apart. Each crash logs
what a job's teardown logs on every GPU it ran on: Xid 13 (the faulting kernel) on one, Xid 43 (the channel reset
as the process dies) and Xid 45 (preemptive cleanup) on all of them."""

from __future__ import annotations

import pytest

from agents.simulator import FleetSimulator
from streams.fault_bins.rules import check_record
from tests.streams.test_fault_bins import Table

T0 = 1_760_000_000.0
DRAIN_BINS = {"reset", "reboot", "inspect", "replace"}


def crash_loop(crashes: int, every_s: float) -> dict:
    faults = []
    for k in range(crashes):
        at = 600.0 + k * every_s
        faults.append({"kind": "xid", "at": at, "host": 1, "gpu": 2, "code": 13, "hardware": False})
        for host in range(4):  # job-0000: hosts 0-3, 32 ranks
            for gpu in range(8):
                faults.append({"kind": "xid", "at": at + 1, "host": host, "gpu": gpu, "code": 43, "hardware": False})
                faults.append({"kind": "xid", "at": at + 2, "host": host, "gpu": gpu, "code": 45, "hardware": False})
    return {"name": "crash-loop", "fleet": {"hosts": 8, "jobs": [4]}, "faults": faults}


@pytest.mark.parametrize("crashes, every_s", [(2, 300.0), (5, 120.0), (8, 1800.0), (20, 600.0), (20, 3600.0)])
def test_a_crash_loop_drains_nothing_and_escalates_nothing(crashes, every_s):
    scenario = crash_loop(crashes, every_s)
    interval = 60.0
    sim = FleetSimulator(seed=crashes, start_ts=T0, scenario=scenario, interval=interval, nccl_interval=0,
                         net_interval=0, status_interval=0)
    table, truth = Table(), []
    for _ in range(int((600 + crashes * every_s + 1200) / interval)):
        tick = sim.step()
        truth += tick.truth
        table.feed([check_record(x, "xid") for x in tick.xid] + [check_record(s, "sample") for s in tick.samples])
    assert len(truth) == crashes * 65 and not any(t["hardware"] for t in truth)
    assert {f.code for f in table.faults} <= {"xid:13", "xid:43", "xid:45"}, {f.code for f in table.faults}
    assert [f for f in table.faults if f.bin in DRAIN_BINS or f.rule.startswith("escalation")] == []
