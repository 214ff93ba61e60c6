"""The silence stage's rules and steps, offline: a silent host is a fault, a silent rack or fleet one alert and no
fault, a goodbye or a drained node nothing, a broken monitor and a stalled job an alert and no fault."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from core.errors import ConfigError, DecodeError
from schemas.topics import ALERTS, FAULTS, NODE_STATE, SAMPLES, AGENT, NCCL, SILENCE_FLEET
from streams import registry
from streams.runtime.offline import offline_steps
from streams.runtime.spec import Record
from streams.settings import streams_settings
from streams.silence.rules import FleetClock, HostView, SilenceConfig
from streams.silence.stage import check_fleet

T0 = 1_700_000_000.0
WALL0 = 1_800_000_000_000  # ms: the Kafka time of the fleet step's records


class Fleet:
    """The silence stage offline: hosts that report every `interval` s (samples, or agent status alone), fed through
    the seen step into the fleet step with a wall clock that runs `wall_per_s` ms per event-time second."""

    def __init__(self, racks: dict[str, int], interval: float = 10.0, wall_per_s: int = 1000, partitions: int = 1,
                 **config):
        settings = streams_settings(None, silence=SilenceConfig(**config)) if config else streams_settings(None)
        steps = {s.step.run.__name__: s for s in offline_steps([registry.STAGES["silence"]], settings)}
        self.seen, self.jobs_step, self.fleet = steps["seen_step"], steps["jobs_step"], steps["fleet_step"]
        self.hosts = {f"{rack}-h{i}": rack for rack, n in racks.items() for i in range(n)}
        self.partition = {h: i % partitions for i, h in enumerate(self.hosts)}
        self.interval, self.wall_per_s, self.t, self.offset = interval, wall_per_s, T0, 0
        self.down: set[str] = set()
        self.monitor: dict[str, dict] = {}  # host -> failing collectors (status, no samples)
        self.job: dict[str, str | None] = {}
        self.out: list[dict] = []

    def _feed(self, step, topic, kind, host: str, value: dict) -> list:
        self.offset += 1
        emits = step.run([Record(kind, value, host, topic.name, self.partition.get(host, 0), self.offset, 0)])
        records = [Record("fleet", orjson.loads(e.value), e.key.decode(), SILENCE_FLEET.name, 0, self.offset,
                          int(WALL0 + (self.t - T0) * self.wall_per_s)) for e in emits if e.to is SILENCE_FLEET]
        for e in self.fleet.run(records) if records else []:
            self.out.append({"topic": e.to.name, **orjson.loads(e.value)})
        return emits

    def status(self, host: str, *, failing: dict | None = None, state: str = "running",
               unsupported: dict | None = None) -> None:
        collectors = [] if unsupported else ["nvml", "kernel_log"]
        self._feed(self.seen, AGENT, "status", host, {"host": host, "rack": self.hosts[host], "ts": self.t,
                                                      "failing": failing or {}, "state": state,
                                                      "job": self.job.get(host), "collectors": collectors,
                                                      "unsupported": unsupported or {}})

    def node(self, host: str, schedulable: bool) -> None:
        self._feed(self.seen, NODE_STATE, "node", host, {"host": host, "schedulable": schedulable, "ts": self.t})

    def collective(self, job: str) -> None:
        self._feed(self.jobs_step, NCCL, "nccl", job, {"job": job, "ranks": [{"ts": self.t}]})

    def run(self, seconds: float, jobs: tuple[str, ...] = ()) -> None:
        """Every host up reports each interval; each job in `jobs` has a collective each interval."""
        end = self.t + seconds
        while self.t < end:
            self.t += self.interval
            for host in self.hosts:
                if host in self.down:
                    continue
                if host in self.monitor:
                    self.status(host, failing=self.monitor[host])
                    continue
                self._feed(self.seen, SAMPLES, "sample", host, {"host": host, "rack": self.hosts[host],
                                                                "ts": self.t, "job": self.job.get(host)})
            for job in jobs:
                self.collective(job)

    def faults(self) -> list[dict]:
        return [o for o in self.out if o["topic"] == FAULTS.name]

    def alerts(self, name: str | None = None) -> list[tuple]:
        return [(o["alertname"], o["status"], o["host"] or o["rack"] or o["labels"].get("job") or "fleet")
                for o in self.out if o["topic"] == ALERTS.name and name in (None, o["alertname"])]


def test_one_silent_host_is_a_fault_to_reboot_with_its_evidence_and_only_once():
    f = Fleet({"r1": 4, "r2": 4})
    f.run(120)
    f.down.add("r1-h2")
    last = f.t
    f.run(80)
    assert f.faults() == []  # 80 s: silent (60 s) but not yet judged (60 + 30 s)
    f.run(400)
    [fault] = f.faults()
    assert (fault["host"], fault["code"], fault["bin"], fault["rule"], fault["gpu_index"]) == \
        ("r1-h2", "host_silent", "reboot", "silence", None)
    heard = fault["first_ts"]  # its last report to the fleet step: at most report_s (20 s) before its last sample
    assert last - 20 <= heard <= last and 90 <= fault["last_ts"] - heard <= 100
    assert fault["fault_id"] == f"r1-h2/-/host_silent/reboot/{int(heard)}"
    assert fault["evidence"]["rack_reporting"] == "3" and fault["evidence"]["fleet_silent"] == "1"
    assert "3 of the other 3 hosts of rack r1 still report" in fault["reasons"][0]
    assert f.alerts() == []


def test_a_rack_that_goes_silent_together_is_one_alert_and_no_fault_until_it_returns():
    f = Fleet({"r1": 4, "r2": 4, "r3": 4, "r4": 4, "r5": 4, "r6": 4, "r7": 4, "r8": 4, "r9": 4, "r10": 4},
              fleet_min_hosts=5)
    f.run(120)
    f.down |= {"r3-h0", "r3-h1", "r3-h2"}  # 3 of 4: its switch
    f.run(300)
    assert f.faults() == []
    assert f.alerts() == [("RackSilent", "firing", "r3")]
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert firing["severity"] == "critical" and firing["value"] == 3.0
    assert firing["labels"]["hosts"] == "r3-h0,r3-h1,r3-h2" and "no host is drained" in firing["summary"]
    f.down.clear()
    f.run(60)
    assert f.alerts() == [("RackSilent", "firing", "r3"), ("RackSilent", "resolved", "r3")]
    assert f.faults() == []


def test_many_hosts_across_racks_silent_together_is_one_fleet_alert_and_no_fault():
    f = Fleet({f"r{i}": 4 for i in range(8)})  # 32 hosts: 4 silent over 4 racks is the collector network
    f.run(120)
    f.down |= {"r0-h0", "r1-h1", "r2-h2", "r3-h3"}
    f.run(300)
    assert f.faults() == [] and f.alerts() == [("FleetSilent", "firing", "fleet")]


def test_a_host_still_silent_when_its_rack_returns_is_judged_on_its_own():
    f = Fleet({f"r{i}": 4 for i in range(10)}, fleet_min_hosts=5)
    f.run(120)
    f.down |= {"r3-h0", "r3-h1", "r3-h2"}
    f.run(300)
    f.down -= {"r3-h1", "r3-h2"}  # the switch is back; r3-h0 stays dead
    back = f.t
    f.run(300)
    assert f.faults() == []  # a host may boot minutes after its rack: rejoin_s (600 s)
    f.run(400)
    assert f.alerts() == [("RackSilent", "firing", "r3"), ("RackSilent", "resolved", "r3")]
    [fault] = f.faults()
    ended = float(fault["evidence"]["outage_ended_ts"])
    assert fault["host"] == "r3-h0" and back < ended <= back + 40 and 600 <= fault["ts"] - ended <= 620
    assert "did not come back with the rest" in fault["reasons"][-1]


def hold(f: Fleet, late: set[int], lag_s: float, ticks: int) -> None:
    """Run `ticks` intervals with the samples of partitions `late` read `lag_s` of event time after the others."""
    held: list[dict] = []
    for _ in range(ticks):
        f.t += f.interval
        for host in f.hosts:
            if host in f.down:
                continue
            value = {"host": host, "rack": f.hosts[host], "ts": f.t}
            (held.append if f.partition[host] in late else lambda v: f._feed(f.seen, SAMPLES, "sample", host, v))(
                value)
        while held and held[0]["ts"] <= f.t - lag_s:
            value = held.pop(0)
            f._feed(f.seen, SAMPLES, "sample", value["host"], value)


def test_a_rack_back_from_a_power_loss_read_in_two_batches_is_no_host_fault():
    """A rack loses power and comes back: all its hosts report again in the same instant, but the consumer reads the
    partition of three of them 40 s later than the other five. With five back the rack's alert resolves while three
    are still behind the clock; they are no host_silent (no false drain, no breaker) - they are back 40 s later."""
    f = Fleet({f"r{i}": 8 for i in range(10)})
    rack = [h for h in f.hosts if h.startswith("r3-")]
    f.partition = {h: 1 if h in rack[5:] else 0 for h in f.hosts}
    f.run(120)
    f.down |= set(rack)
    f.run(400)
    f.down.clear()
    hold(f, {1}, 40.0, 30)
    f.run(900)
    assert f.faults() == []
    assert f.alerts() == [("RackSilent", "firing", "r3"), ("RackSilent", "resolved", "r3")]


def test_a_rack_whose_hosts_wait_different_wall_times_is_judged_as_a_rack_at_any_pace():
    """Flat out (event time 100x the wall clock, a 1 s wall wait): five of a rack's eight hosts sit alone on a
    partition that stops moving when the rack goes (three wall waits, 300 s of event time), three on a partition that
    moves on (one wall wait, 100 s). The three are due first; their rack would be out with the five behind the clock,
    so they wait for them, and the rack is one RackSilent counting all eight - never three host faults."""
    f = Fleet({f"r{i}": 8 for i in range(10)}, wall_per_s=10, wall_wait_s=1.0)
    rack = [h for h in f.hosts if h.startswith("r3-")]
    f.partition = {h: 1 if h in rack[3:] else 0 for h in f.hosts}
    f.run(120)
    f.down |= set(rack)
    f.run(600)
    assert f.faults() == []
    assert f.alerts() == [("RackSilent", "firing", "r3")]
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert firing["value"] == 8.0 and firing["labels"]["hosts"] == ",".join(sorted(rack))


def test_hosts_silent_one_after_another_are_no_rack_outage():
    """A host that died and was faulted (its drain refused, say) is no part of a later outage of its rack."""
    f = Fleet({f"r{i}": 4 for i in range(10)})
    f.run(120)
    f.down.add("r3-h0")
    f.run(600)
    f.down.add("r3-h1")
    f.run(600)
    assert [x["host"] for x in f.faults()] == ["r3-h0", "r3-h1"] and f.alerts() == []


def test_a_fleet_outage_is_one_fleet_alert_not_one_per_rack_and_rackless_hosts_count_too():
    f = Fleet({f"r{i}": 4 for i in range(10)})
    f.run(120)
    f.down |= {h for h in f.hosts if not h.startswith("r9")}  # the collector network: 9 racks of 10
    f.run(300)
    assert f.faults() == [] and f.alerts() == [("FleetSilent", "firing", "fleet")]
    g = Fleet({"": 40})  # no rack labels: half of them silent together is still the network, not 20 drains
    g.run(120)
    g.down |= {h for i, h in enumerate(g.hosts) if i % 2}
    g.run(300)
    assert g.faults() == [] and g.alerts() == [("FleetSilent", "firing", "fleet")]


def test_a_fleet_outage_read_flat_out_counts_every_silent_host_not_those_whose_wall_wait_ended_first():
    """Flat out (event time 100x the wall clock, a 1 s wall wait), 20 hosts of 5 racks go silent together; the
    partition of half of them stops moving (three wall waits), the other half's moves on (one). FleetSilent fires once
    the first are due and counts all 20, not the 10 whose wall wait ended first."""
    f = Fleet({f"r{i}": 8 for i in range(10)}, wall_per_s=10, wall_wait_s=1.0)
    gone = [h for h in f.hosts if h.endswith(("-h0", "-h1", "-h2", "-h3")) and h[:2] in ("r0", "r2", "r4", "r6", "r8")]
    f.partition = {h: 1 if h in gone[::2] else 0 for h in f.hosts}
    f.run(120)
    f.down |= set(gone)
    f.run(600)
    assert f.faults() == [] and f.alerts() == [("FleetSilent", "firing", "fleet")]
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert firing["value"] == 20.0 and firing["summary"].startswith("20 of 80 hosts"), firing["summary"]


def test_a_goodbye_is_believed_for_an_hour():
    f = Fleet({"r1": 4, "r2": 4})
    f.run(60)
    f.status("r1-h0", state="stopping")
    f.down.add("r1-h0")
    f.run(3500)
    assert f.faults() == []
    f.run(300)
    assert [x["host"] for x in f.faults()] == ["r1-h0"]


def test_a_goodbye_or_a_drained_node_then_silence_is_no_fault():
    f = Fleet({"r1": 4, "r2": 4})
    f.run(60)
    f.status("r1-h0", state="stopping")  # maintenance: the agent stopped in order
    f.down.add("r1-h0")
    f.node("r2-h1", schedulable=False)  # drained: its reboot silences it
    f.down.add("r2-h1")
    f.run(600)
    assert f.faults() == [] and f.alerts() == []
    f.down.clear()
    f.node("r2-h1", schedulable=True)
    f.run(60)
    f.down.add("r2-h1")  # back in service, then silent: a fault now
    f.run(200)
    assert [x["host"] for x in f.faults()] == ["r2-h1"]


def test_back_from_maintenance_or_dead_after_a_status_is_no_broken_monitor():
    """Two ways the llama3-mix run once raised MonitorBroken for nothing: a maintained host back after 20 minutes
    speaks (its status) before its first sample; a host whose last status was read just before its last sample and
    then died is silent, not a broken monitor."""
    f = Fleet({"r1": 4, "r2": 4}, partitions=2, report_s=5)  # every record that moves a host 5 s is reported
    f.run(60)
    f.down.add("r1-h0")
    f.run(10)
    f.status("r1-h0", state="stopping")  # its goodbye, in a tick without its sample
    f.run(1200)
    f.down.discard("r1-h0")
    f.status("r1-h0")  # back: the agent speaks, its first sample follows in the next tick
    f.run(120)
    f.down.add("r2-h1")
    f.t += 10
    f.status("r2-h1")  # read before its sample of the same tick (reported: it moved the host), then it dies
    f._feed(f.seen, SAMPLES, "sample", "r2-h1", {"host": "r2-h1", "rack": "r2", "ts": f.t})
    f.t -= 10
    f.run(300)
    assert [a for a in f.alerts() if a[0] == "MonitorBroken"] == []
    assert [x["host"] for x in f.faults()] == ["r2-h1"]


def test_a_broken_monitor_alerts_from_its_first_failing_report_and_never_drains():
    f = Fleet({"r1": 4, "r2": 4})
    f.run(60)
    f.monitor["r1-h1"] = {"nvml": "NVMLError_Unknown: Unknown Error"}
    first = f.t + f.interval
    f.run(300)
    assert f.faults() == []
    assert f.alerts() == [("MonitorBroken", "firing", "r1-h1")]
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert firing["starts_at"] == first and "NVMLError_Unknown" in firing["summary"]
    assert firing["labels"]["samples_collector_failing"] == "true"
    del f.monitor["r1-h1"]
    f.status("r1-h1")  # the agent says so at once
    f.run(30)
    assert f.alerts()[-1] == ("MonitorBroken", "resolved", "r1-h1")


def test_status_without_samples_and_no_error_is_a_broken_monitor_too():
    f = Fleet({"r1": 4, "r2": 4})
    f.run(60)
    f.monitor["r2-h3"] = {}  # a hung NVML call: the agent still sends status, says nothing fails
    f.run(200)
    assert f.faults() == [] and f.alerts() == [("MonitorBroken", "firing", "r2-h3")]


def test_samples_behind_the_status_topic_or_a_host_back_from_silence_is_no_broken_monitor():
    """Samples and status travel on two topics: every host's status may reach the stage before its samples (here
    the samples topic lags 90 s), and a host back from silence sends its status before its first sample."""
    f = Fleet({"r1": 4, "r2": 4})
    f.run(60)
    f.down.add("r1-h0")
    f.run(200)
    lagging = []
    for _ in range(30):
        f.t += 10
        for host in f.hosts:
            f.status(host)
            lagging.append((host, f.t))
        while lagging and lagging[0][1] <= f.t - 90:
            host, ts = lagging.pop(0)
            f._feed(f.seen, SAMPLES, "sample", host, {"host": host, "rack": f.hosts[host], "ts": ts})
    assert [a for a in f.alerts() if a[0] == "MonitorBroken"] == []
    assert [x["host"] for x in f.faults()] == ["r1-h0"]  # silent before, back now: judged once


def test_an_agent_whose_nvml_never_started_is_a_broken_monitor():
    """NVML dead since boot: the agent's probe failed, so nvml is `unsupported`, not failing; no sample collector
    runs, so the host is a broken monitor. With dcgm running and sampling instead, nvml's absence is no alert."""
    f = Fleet({"r1": 4, "r2": 4})
    f.down |= {"r1-h0", "r1-h1"}
    for _ in range(10):
        f.t += 10
        f.status("r1-h0", unsupported={"nvml": "nvmlInit: NVMLError_DriverNotLoaded"})
        f._feed(f.seen, AGENT, "status", "r1-h1", {"host": "r1-h1", "rack": "r1", "ts": f.t, "failing": {},
                                                   "state": "running", "collectors": ["dcgm"],
                                                   "unsupported": {"nvml": "no NVML"}})
        f._feed(f.seen, SAMPLES, "sample", "r1-h1", {"host": "r1-h1", "rack": "r1", "ts": f.t, "source": "dcgm"})
        f.run(0.1)
    assert f.alerts() == [("MonitorBroken", "firing", "r1-h0")] and f.faults() == []
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert "unsupported: nvmlInit: NVMLError_DriverNotLoaded" in firing["summary"]


def test_a_job_whose_collectives_stop_while_its_hosts_report_it_stalls_without_a_drain():
    f = Fleet({"r1": 4, "r2": 4})
    f.job = {h: "train-1" for h in f.hosts if h.startswith("r1")}
    f.run(100, jobs=("train-1",))
    f.run(200)  # collectives stop; hosts still run it
    assert f.faults() == []
    assert f.alerts() == [("JobStalled", "firing", "train-1")]
    firing = next(o for o in f.out if o["topic"] == ALERTS.name)
    assert firing["labels"]["cause"] == "software" and firing["labels"]["job"] == "train-1"
    f.run(40, jobs=("train-1",))  # judged when the clock next moves: within report_s
    assert f.alerts()[-1] == ("JobStalled", "resolved", "train-1")
    f.job = {}
    f.run(300)  # the job ended: its hosts report no job, no stall
    assert len(f.alerts("JobStalled")) == 2


def test_a_stall_with_a_silent_host_names_the_hardware_evidence():
    f = Fleet({"r1": 4, "r2": 4})
    f.job = {h: "train-2" for h in f.hosts}
    f.run(100, jobs=("train-2",))
    f.down.add("r2-h0")
    f.run(300)
    stall = next(o for o in f.out if o.get("alertname") == "JobStalled")
    assert stall["labels"]["cause"] == "hardware" and stall["labels"]["evidence_hosts"] == "r2-h0"
    assert [x["host"] for x in f.faults()] == ["r2-h0"]


def test_a_stall_with_a_host_short_of_a_gpu_or_drained_from_it_is_hardware():
    """The job stops because one of its hosts lost a GPU (its samples had 8 rows, now 7) or was drained for a fault:
    hardware, not software, though every host still reports and the drained one no longer counts as the job's."""
    f = Fleet({"r1": 4, "r2": 4})
    f.job = {h: "train-3" for h in f.hosts}
    f.run(100, jobs=("train-3",))
    for k in range(30):  # after a minute r1-h1's GPU 5 falls off the bus: its samples carry 7 rows of 8
        f.t += 10
        for host in f.hosts:
            f._feed(f.seen, SAMPLES, "sample", host, {"host": host, "rack": f.hosts[host], "ts": f.t,
                                                      "job": "train-3",
                                                      "gpus": [{}] * (7 if host == "r1-h1" and k >= 6 else 8)})
    stall = next(o for o in f.out if o.get("alertname") == "JobStalled")
    assert stall["labels"]["cause"] == "hardware" and stall["labels"]["evidence_hosts"] == "r1-h1", stall["labels"]
    assert "r1-h1 silent, out of service, with a broken monitor or a lost GPU" in stall["summary"]

    g = Fleet({"r1": 4, "r2": 4})
    g.job = {h: "train-4" for h in g.hosts}
    g.run(100, jobs=("train-4",))
    g.node("r2-h3", schedulable=False)  # drained for its fault; the job's collectives stop with it
    g.run(300)
    stall = next(o for o in g.out if o.get("alertname") == "JobStalled")
    assert stall["labels"]["cause"] == "hardware" and stall["labels"]["evidence_hosts"] == "r2-h3", stall["labels"]
    assert g.faults() == []  # a drained host's silence is expected: no fault of its own


def test_a_host_behind_in_a_replay_waits_for_the_wall_clock():
    """After an outage the agents' spools replay: event time races ahead of wall time, and a host whose spool is
    behind is not judged until `wall_wait_s` of wall time has passed with it silent."""
    f = Fleet({"r1": 4, "r2": 4}, wall_per_s=10)  # event time 100x faster than wall time
    f.run(60)
    f.down.add("r1-h0")
    f.run(300)  # 3 s of wall time
    assert f.faults() == []
    f.run(1000)  # 10 s more
    assert [x["host"] for x in f.faults()] == ["r1-h0"]


def test_a_partition_fetched_later_than_the_others_is_not_silent():
    """Flat out (event time 100x the wall clock, a 1 s wall wait), the consumer reads one partition 150 s of event
    time behind the others: its hosts are behind the clock, but no host of their partition is ahead of them, so they
    wait three wall waits; a host that died on a partition that moves on is judged after one."""
    f = Fleet({"r1": 4, "r2": 4, "r3": 4, "r4": 4}, wall_per_s=10, partitions=4, wall_wait_s=1.0)
    f.run(60)
    held = []
    f.down.add("r1-h1")  # partition 1: its partition-mates keep reporting
    for n in range(40):
        f.t += 10
        for host in f.hosts:
            if host in f.down:
                continue
            if n % 6 == 0:  # the agents' status, on time: the late samples are no broken monitor either
                f.status(host)
            value = {"host": host, "rack": f.hosts[host], "ts": f.t}
            if f.partition[host] == 3:
                held.append(value)
            else:
                f._feed(f.seen, SAMPLES, "sample", host, value)
        while held and held[0]["ts"] <= f.t - 150:
            value = held.pop(0)
            f._feed(f.seen, SAMPLES, "sample", value["host"], value)
    assert [x["host"] for x in f.faults()] == ["r1-h1"] and f.alerts() == []


def test_a_broken_monitor_whose_status_topic_lags_stays_one_alert_and_no_fault():
    """Its status records (its only sign of life) reach the stage 80 s behind the other hosts' samples, flat out: it
    is behind the clock, but its own topic-partition is not ahead of it, so it is not silent, and its MonitorBroken
    neither resolves nor fires again meanwhile."""
    f = Fleet({"r1": 4, "r2": 4}, wall_per_s=10, partitions=2, wall_wait_s=1.0)
    f.run(60)
    late = []
    for _ in range(50):
        f.t += 10
        for host in f.hosts:
            if host != "r2-h1":
                f._feed(f.seen, SAMPLES, "sample", host, {"host": host, "rack": f.hosts[host], "ts": f.t})
        late.append(f.t)
        while late and late[0] <= f.t - 80:
            ts, now = late.pop(0), f.t
            f.t = ts
            f.status("r2-h1", failing={"nvml": "NVMLError_GpuIsLost"})
            f.t = now
    assert f.alerts() == [("MonitorBroken", "firing", "r2-h1")] and f.faults() == []


def test_the_clock_ignores_a_host_whose_clock_runs_ahead():
    views = {f"h{i}": HostView(alive_ts=T0) for i in range(20)}
    views["ahead"] = HostView(alive_ts=T0 + 3600)
    clock = FleetClock(views)
    assert clock.read(0.0, 0.98) == T0
    clock.move("ahead", HostView(alive_ts=T0 + 10))
    assert clock.read(0.0, 0.98) == T0 and clock.read(T0 + 5, 0.98) == T0 + 5  # never back
    clock.move("h0", HostView(alive_ts=T0 + 20, bye=True))  # a goodbye leaves the clock
    assert "h0" not in clock.at


@pytest.mark.parametrize("config, field", [({"report_s": 60.0}, "report_s"), ({"rack_share": 0.0}, "rack_share"),
                                           ({"stall_after_s": -1}, "stall_after_s")])
def test_bad_silence_config_names_the_field(config, field):
    with pytest.raises(ValidationError, match=field):
        SilenceConfig(**config)
    with pytest.raises(ConfigError, match="silence"):
        streams_settings(None, silence=config)


@pytest.mark.parametrize("value", [[], {"kind": "rack"}, {"kind": "host", "host": "h"},
                                   {"kind": "job", "job": "j", "ts": "soon"}])
def test_the_fleet_topic_refuses_what_the_seen_steps_never_send(value):
    with pytest.raises(DecodeError):
        check_fleet(value)


async def test_the_stage_on_the_runtime_judges_with_kafka_time_in_milliseconds(tmp_path):
    """Through the worker's faust lanes: samples in, reports on silence-fleet, a fault out once the wall wait (1 s
    here, from the records' Kafka timestamps) has passed: a Kafka time read in the wrong unit never gets there."""
    import asyncio

    from core.settings import load
    from streams.faust_adapter.app import create_app
    from streams.groups import app_id
    from streams.emit import MemoryEmitter
    from streams.settings import StreamsSettings
    from tests.streams.helpers import put_on, until

    emitter = MemoryEmitter()
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix="unit.", data_dir=tmp_path,
                    silence=SilenceConfig(wall_wait_s=1.0))
    app = create_app(settings, stages=["silence"], emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    fleet_topic, faults = SILENCE_FLEET.full(app_id("unit.")), "unit." + FAULTS.name
    hosts = [f"h{i}" for i in range(6)]
    async with app.agents["lane.telemetry"].test_context() as seen, \
            app.agents["lane.silence"].test_context() as fleet:
        async def ticks(first: int, last: int) -> None:
            """Every host but h5 (silent after tick 4) samples each 10 s; the reports then go on to the fleet lane."""
            before = len(emitter.to(fleet_topic))
            for n in range(first, last):
                for i, h in enumerate(hosts if n < 5 else hosts[:-1]):
                    sample = {"host": h, "rack": "r1", "ts": T0 + 10 * n, "seq": n, "gpus": []}
                    await put_on(seen, "unit." + SAMPLES.name, orjson.dumps(sample), h.encode(), i % 2)
            await until(lambda: len(emitter.to(fleet_topic)) > before + (last - first) // 2 * 5 - 1)
            for s in emitter.to(fleet_topic)[before:]:
                await put_on(fleet, fleet_topic, s.value, s.key, 0)

        await ticks(0, 30)
        await asyncio.sleep(0.3)
        assert emitter.to(faults) == []  # behind and its partition moved on, but 1 s of wall time has not passed
        await asyncio.sleep(1.0)
        await ticks(30, 34)
        await until(lambda: emitter.to(faults))
    [fault] = [orjson.loads(s.value) for s in emitter.to(faults)]
    assert (fault["host"], fault["code"]) == ("h5", "host_silent")


def test_samples_of_one_partition_read_late_in_a_burst_are_no_broken_monitor_for_a_host_whose_status_was_on_time():
    """A broker hiccup holds one samples partition back (160 s of event time, flat out) while the status topic flows.
    A host on it whose status came on time has spoken without samples; when the partition's samples arrive in a burst,
    its partition-mates' reports move the partition on, and its own samples, read in the same burst, must reach the
    fleet step as soon (not with its next status), or it looks like an agent that speaks without samples. Seen in CI:
    two false MonitorBroken pages in the broken-monitor scenario after NotLeaderForPartition errors."""
    f = Fleet({"r1": 4, "r2": 4}, partitions=2, wall_per_s=10, wall_wait_s=1.0)
    f.run(60)
    held = []
    for n in range(30):
        f.t += 10
        if n == 16:  # the partition is back: its held samples first, in order
            for late in held:
                f._feed(f.seen, SAMPLES, "sample", late["host"], late)
        for host in sorted(f.hosts, key=f.partition.get):  # partition 0 first: the clock moves on before 1 reports
            if n % 3 == 0 and f.partition[host] == 1 and host.endswith("h1"):  # these hosts' status on time
                f.status(host)
            value = {"host": host, "rack": f.hosts[host], "ts": f.t}
            if f.partition[host] == 1 and n < 16:
                held.append(value)
            else:
                f._feed(f.seen, SAMPLES, "sample", host, value)
    assert f.faults() == [] and f.alerts() == []
