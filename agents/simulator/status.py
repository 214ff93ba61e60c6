"""Each simulated host agent's own status (AgentStatus on fleet.telemetry.agent): one at start, one every
`every_s` while nothing changes, one at once on a change (a collector starts or stops failing, the host is back),
one every tick while a collector fails, and a last one saying 'stopping' when the agent is stopped in order.
Column-wise per host, so a 2,048-host tick costs one record per host that speaks, not one per host."""

from __future__ import annotations

import numpy as np

from agents.simulator.fleet import Fleet
from agents.simulator.gpu_state import Effects

STATUS_EVERY_S = 60.0  # a real agent's default cadence (agent_status_every_s)
COLLECTORS = ("nvml", "kernel_log")  # what a simulated agent runs: GPU samples and the kernel log's XID lines
SAMPLE_COLLECTOR = "nvml"  # the collector whose failure stops the samples (monitor_broken)


class AgentStatuses:
    """Per host: when its next periodic status is due (simulated seconds after the run's start), its status
    sequence number, and whether it was up and failing at its last tick. Sequence numbers count every status the
    host has published this run, across its restarts."""

    def __init__(self, fleet: Fleet, every_s: float = STATUS_EVERY_S):
        if every_s <= 0:
            raise ValueError("every_s must be > 0")
        n = fleet.n_hosts
        self.fleet, self.every_s = fleet, every_s
        self.next_due = np.zeros(n)  # every host speaks at its first tick
        self.seq = np.zeros(n, dtype=np.int64)
        self.was_up = np.ones(n, dtype=bool)
        self.was_failing = np.zeros(n, dtype=bool)

    def records(self, t_now: float, ts: float, fx: Effects) -> list[dict]:
        """The AgentStatus dicts the hosts publish in the tick at relative time t_now (timestamp ts), host order."""
        n = self.fleet.n_hosts
        up = fx.host_up
        failing = np.zeros(n, dtype=bool)
        failing[list(fx.monitor_errors)] = True
        failing &= up
        back = up & ~self.was_up  # a host that returns starts a fresh agent: it speaks at once
        changed = up & (failing != self.was_failing)
        due = up & (t_now >= self.next_due - 1e-9)
        now = back | changed | failing  # a failing collector: the agent says so every tick (every poll)
        speak = now | due
        periodic = due & ~now
        # the periodic timer keeps its phase; any other status starts the wait afresh
        self.next_due[periodic] += self.every_s * (np.floor((t_now - self.next_due[periodic]) / self.every_s) + 1)
        self.next_due[now] = t_now + self.every_s
        bye = fx.goodbye & self.was_up
        out = [self._record(h, ts, "stopping" if bye[h] else "running", fx.monitor_errors.get(h))
               for h in np.flatnonzero(speak | bye).tolist()]
        self.was_up = up.copy()
        self.was_failing = failing
        return out

    def _record(self, h: int, ts: float, state: str, error: str | None) -> dict:
        f = self.fleet
        seq = int(self.seq[h])
        self.seq[h] += 1
        return {"host": f.hosts[h], "rack": f.racks[h], "cluster": f.cluster, "job": f.job_name_of_host(h),
                "ts": ts, "seq": seq, "state": state, "collectors": list(COLLECTORS),
                "failing": {} if error is None else {SAMPLE_COLLECTOR: error}, "unsupported": {},
                "source": "simulator"}
