"""Fleet simulator: publishes the telemetry of thousands of virtual Hopper GPUs, with injected faults and ground truth.

Scenario files (JSON; shipped ones live in agents/simulator/scenarios/, full reference in its README.md)::

    {"name": "thermal-runaway",                  # [A-Za-z0-9._-]+
     "description": "free text",
     "fleet": {"hosts": 8, "jobs": [8]},         # optional: hosts, jobs (host counts), hosts_per_rack, rack_budgets_w
     "run": {"duration_s": 300, "interval_s": 1},  # optional defaults for simulate: + nccl_interval_s, seed
     "faults": [
       {"kind": "thermal_runaway",               # xid | thermal_runaway | power_cap | slow_rank | ecc_dbe |
                                                 # row_remap_failure | nvlink_crc | pcie_replay | gpu_lost |
                                                 # congestion | sensor_flap | host_down | job_crash | power_surge
                                                 # | monitor_broken
        "at": 30,                                # seconds of simulated time after the run's start
        "duration": 60,                          # seconds; omit = until the run ends
        "host": 2, "gpu": 5,                     # target: host index or hostname (+ GPU index; omit = all 8)
        # or "job": 0 (index or "job-0000") with "rank": 17
        "cause": "hbm3", "expect": None,         # optional truth label; optional list replacing expected tokens
        "peak_c": 91, "ramp_s": 15}              # kind parameters (see the README's kinds table)
     ],
     "generate": [                               # optional: faults drawn from the seed in exact proportions
       {"count": 10, "between": [60, 600],
        "causes": [{"cause": "faulty_gpu", "weight": 3, "fault": {"kind": "gpu_lost"}}]}]}

Each injection yields one InjectedFault on fleet.sim.truth when it starts (a whole rack's host_down one per host of
the rack); unknown fields are errors that name the field (e.g. ``faults.0.thermal_runaway.peak_c``). Every host's
agent also publishes its AgentStatus on fleet.telemetry.agent (agents/simulator/status.py).
"""

from agents.simulator.simulate import FleetSimulator, SimulationReport, Tick, build_tick, simulate
from agents.simulator.scenario import Scenario, load_scenario

__all__ = ["FleetSimulator", "SimulationReport", "Scenario", "Tick", "build_tick", "load_scenario", "simulate"]
