"""Fleet simulator: publishes the telemetry of thousands of virtual Hopper GPUs, with injected faults and ground truth.

Scenario files (JSON; shipped ones live in agents/simulator/scenarios/, full reference in its README.md)::

    {"name": "thermal-runaway",                  # [A-Za-z0-9._-]+
     "description": "free text",
     "faults": [
       {"kind": "thermal_runaway",               # xid | thermal_runaway | power_cap | slow_rank | ecc_dbe |
                                                 # row_remap_failure | nvlink_crc | pcie_replay | gpu_lost
        "at": 30,                                # seconds of simulated time after the run's start
        "duration": 60,                          # seconds; omit = until the run ends
        "host": 2, "gpu": 5,                     # target: host index or hostname (+ GPU index; omit = all 8)
        # or "job": 0 (index or "job-0000") with "rank": 17
        "peak_c": 91, "ramp_s": 15}              # kind parameters (xid: code, message, count, every, caused_by;
     ]}                                          # power_cap: cap_w; slow_rank: slowdown_pct;
                                                 # nvlink_crc / pcie_replay: rate_per_s)

Each injection yields one InjectedFault on fleet.sim.truth when it starts; unknown fields are errors that name
the field (e.g. ``faults.0.thermal_runaway.peak_c``).
"""

from agents.simulator.runner import FleetSimulator, SimulationReport, Tick, build_tick, simulate
from agents.simulator.scenario import Scenario, load_scenario

__all__ = ["FleetSimulator", "SimulationReport", "Scenario", "Tick", "build_tick", "load_scenario", "simulate"]
