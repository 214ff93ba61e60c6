"""The agent's own status (AgentStatus on fleet.telemetry.agent): at start, on a change, periodically, a goodbye."""

from __future__ import annotations

import asyncio
import itertools
import os
import time

import orjson
import pytest

from agents.cli import serve
from agents.metrics import exposition
from agents.nvml.fake import FakeNvml
from agents.runner import ERROR_MAX, AgentRunner
from agents.settings import load_agent_settings
from agents.spool import Spool
from core.errors import BrokerError
from schemas.events import AgentStatus
from schemas.topics import AGENT, SAMPLES
from tests.conftest import _free_port

HOST = "gpu-node-0042"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """CI exports broker settings; these tests decide every value themselves."""
    for key in list(os.environ):
        if key.startswith("FLEETPULSE_") or key in ("KAFKA_BOOTSTRAP_SERVERS", "CLICKHOUSE_URL"):
            monkeypatch.delenv(key)


class Recorder:
    """A publisher that keeps what it is sent (checked by the topic's validator, as a consumer would); `refuse`
    makes the next that many sends of the status topic raise."""

    def __init__(self, refuse: int = 0, error: Exception | None = None):
        self.records: list[tuple[str, dict]] = []
        self.refuse, self.error = refuse, error or BrokerError("record refused by the producer")

    async def send(self, topic, value) -> None:
        if topic is AGENT and self.refuse > 0:
            self.refuse -= 1
            raise self.error
        self.records.append((topic.name, topic.check(value.model_dump(mode="json"))))

    def statuses(self) -> list[AgentStatus]:
        return [AgentStatus.model_validate(v) for name, v in self.records if name == AGENT.name]


def settings(**overrides):
    values = dict(agent_host=HOST, agent_rack="r07", agent_cluster="east", agent_job="llama-70b",
                  agent_collectors="nvml,nvml_xid,nccl_inspector", agent_interval_s=0.05, agent_event_poll_s=0.02,
                  agent_status_every_s=3600, agent_recheck_s=0, agent_metrics_port="off")
    return load_agent_settings(**{**values, **overrides})


async def until(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.01)


async def started(runner: AgentRunner, stop: asyncio.Event, after_probe=None) -> asyncio.Task:
    runner.status_min_gap_s = 0.05
    task = asyncio.create_task(runner.run(stop, after_probe=after_probe))
    await until(lambda: runner.status_seq > 0, "the first status")
    return task


async def test_status_at_start_when_nvml_fails_when_it_recovers_and_a_goodbye_at_the_stop():
    nvml, pub, stop = FakeNvml(), Recorder(), asyncio.Event()
    runner = AgentRunner(settings(), publisher=pub, nvml=nvml)
    task = await started(runner, stop)
    await until(lambda: runner.states["nvml"].polls >= 3, "three nvml polls")
    first = pub.statuses()[0]
    assert (first.host, first.rack, first.cluster, first.job, first.source) == (HOST, "r07", "east", "llama-70b",
                                                                                 "agent")
    assert (first.seq, first.state, first.failing) == (0, "running", {})
    assert first.collectors == ["nvml_xid", "nvml"]  # running ones, in the registry's order
    assert first.unsupported == {"nccl_inspector": "FLEETPULSE_AGENT_NCCL_DUMP_DIR is not set"}
    assert len(pub.statuses()) == 1  # nothing changed and the period is an hour: no second record

    nvml.driver_down()  # the driver dies: every NVML call fails, the GPUs may be fine
    await until(lambda: set(pub.statuses()[-1].failing) == {"nvml", "nvml_xid"}, "a status naming both failing")
    broken = pub.statuses()[-1]
    assert "NVMLError_DriverNotLoaded" in broken.failing["nvml"] and "nvmlEventSetWait_v2" in broken.failing["nvml_xid"]
    assert broken.collectors == ["nvml_xid", "nvml"] and broken.state == "running"  # still running, failing
    samples_when_broken = sum(name == SAMPLES.name for name, _ in pub.records)
    polls_when_broken = runner.states["nvml"].polls + runner.states["nvml_xid"].polls
    await until(lambda: runner.states["nvml"].errors >= 3, "three failed nvml polls")
    assert sum(name == SAMPLES.name for name, _ in pub.records) == samples_when_broken  # status, no samples
    # failing on: a status every sample interval (the host's only sign of life), not one per failed poll
    polls = runner.states["nvml"].polls + runner.states["nvml_xid"].polls - polls_when_broken
    assert pub.statuses()[-1].seq - broken.seq < polls

    nvml.driver_up()
    await until(lambda: pub.statuses()[-1].failing == {}, "a status with nothing failing")
    await until(lambda: runner.states["nvml"].polls >= runner.states["nvml"].errors + 6, "polls after recovery")
    stop.set()
    await asyncio.wait_for(task, 10)

    statuses = pub.statuses()
    assert [s.seq for s in statuses] == list(range(len(statuses)))
    assert [s.state for s in statuses] == ["running"] * (len(statuses) - 1) + ["stopping"]
    assert statuses[-1].collectors == ["nvml_xid", "nvml"] and statuses[-1].failing == {}
    assert all(a.ts <= b.ts for a, b in zip(statuses, statuses[1:]))
    running = [(sorted(s.failing), s.collectors) for s in statuses[:-1]]
    changes = [k for k, _ in itertools.groupby(running)]  # repeats: the status every interval while failing
    cols = ["nvml_xid", "nvml"]
    assert changes[0] == changes[-1] == ([], cols) and (["nvml", "nvml_xid"], cols) in changes, changes
    assert 3 <= len(changes) <= 5  # start, failing (nvml, nvml_xid: one record or two), recovered
    assert pub.records[-1][0] == AGENT.name  # the goodbye is the last record the runner hands over
    assert runner.status_sent == len(statuses) and runner.publish_errors == 0


async def test_a_poll_that_hangs_is_a_stalled_collector_named_in_the_status_with_the_call_it_hangs_in():
    nvml, pub, stop = FakeNvml(), Recorder(), asyncio.Event()
    runner = AgentRunner(settings(agent_collectors="nvml", agent_poll_stall_s=0.3), publisher=pub, nvml=nvml)
    task = await started(runner, stop)
    await until(lambda: runner.states["nvml"].polls >= 2, "two polls")
    nvml.hang(3, "nvmlDeviceGetRemappedRows")  # a degrading GPU wedges the driver call: no error, no answer
    await until(lambda: "nvml" in pub.statuses()[-1].failing, "a status naming the stalled collector")
    said = pub.statuses()[-1].failing["nvml"]
    assert said == ("stalled: nvml poll has not returned in 0.3 s (in GPU 3: nvmlDeviceGetRemappedRows): a call "
                    "into the driver or exporter hangs")
    samples = sum(name == SAMPLES.name for name, _ in pub.records)
    await asyncio.sleep(0.3)
    assert sum(name == SAMPLES.name for name, _ in pub.records) == samples  # no samples meanwhile: status only
    nvml.release()
    await until(lambda: pub.statuses()[-1].failing == {}, "the stall over")
    await until(lambda: sum(name == SAMPLES.name for name, _ in pub.records) >= samples + 2, "samples again")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert runner.states["nvml"].errors == 0  # a stall that ends is no failed poll


async def test_a_status_every_period_while_nothing_changes():
    pub, stop = Recorder(), asyncio.Event()
    runner = AgentRunner(settings(agent_status_every_s=0.1), publisher=pub, nvml=FakeNvml())
    task = await started(runner, stop)
    await asyncio.sleep(0.55)
    stop.set()
    await asyncio.wait_for(task, 10)
    statuses = pub.statuses()
    assert 5 <= len(statuses) <= 8, [s.ts for s in statuses]  # at 0, 0.1, ... 0.5 s, and the goodbye
    assert all(s.failing == {} and s.collectors == ["nvml_xid", "nvml"] for s in statuses)
    gaps = [b.ts - a.ts for a, b in zip(statuses[:-1], statuses[1:-1])]
    assert all(0.08 <= g <= 0.3 for g in gaps), gaps


async def test_a_collector_that_starts_running_late_is_announced_at_once():
    nvml, pub, stop = FakeNvml(library_present=False), Recorder(), asyncio.Event()
    runner = AgentRunner(settings(agent_collectors="nvml", agent_recheck_s=0.05), publisher=pub, nvml=nvml)
    task = await started(runner, stop)
    assert pub.statuses()[0].unsupported == {"nvml": "nvmlInit: NVMLError_LibraryNotFound"}
    assert pub.statuses()[0].collectors == []
    nvml.library_present = True  # the driver loaded late
    await until(lambda: pub.statuses()[-1].collectors == ["nvml"], "a status with nvml running")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert pub.statuses()[-2].unsupported == {} and pub.statuses()[-1].state == "stopping"


async def test_a_refused_status_is_counted_and_the_agent_goes_on():
    pub, stop = Recorder(refuse=2, error=RuntimeError("publisher closed")), asyncio.Event()
    runner = AgentRunner(settings(agent_status_every_s=0.05), publisher=pub, nvml=FakeNvml())
    runner.status_min_gap_s = 0.05
    task = asyncio.create_task(runner.run(stop))
    await until(lambda: len(pub.statuses()) >= 2, "statuses after the refused ones")
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert runner.publish_errors == 2
    assert [s.seq for s in pub.statuses()][:2] == [2, 3]  # the refused ones keep their numbers: a gap, not a reuse
    assert pub.statuses()[-1].state == "stopping" and runner.status_sent == len(pub.statuses())


async def test_a_failing_error_is_cut_to_a_bounded_length():
    nvml = FakeNvml()
    runner = AgentRunner(settings(agent_collectors="nvml"), nvml=nvml)
    await runner.probe()

    def boom():
        raise OSError("x" * 5000)

    runner.states["nvml"].collector.sample = boom
    await runner.poll(runner.states["nvml"])
    status = runner.status()
    assert status.failing["nvml"].startswith("OSError('xxx") and len(status.failing["nvml"]) == ERROR_MAX
    runner.states["nvml"].collector.sample = lambda: []
    await runner.poll(runner.states["nvml"])
    assert runner.status().failing == {} and runner.status().seq == 2
    await runner.close()


async def test_once_reports_the_status_it_would_publish():
    nvml = FakeNvml()
    report = await AgentRunner(settings(), nvml=nvml).once(after_probe=nvml.driver_down)
    (status,) = [AgentStatus.model_validate(s) for s in report[AGENT.name]]
    assert (status.host, status.seq, status.state, status.collectors) == (HOST, 0, "running", ["nvml_xid", "nvml"])
    assert set(status.failing) == {"nvml", "nvml_xid"} and "DriverNotLoaded" in status.failing["nvml"]
    assert status.unsupported == {"nccl_inspector": "FLEETPULSE_AGENT_NCCL_DUMP_DIR is not set"}
    assert report["collectors"]["nvml"]["error"] == status.failing["nvml"]


async def test_metrics_show_failing_collectors_and_status_records():
    nvml, pub, stop = FakeNvml(), Recorder(), asyncio.Event()
    runner = AgentRunner(settings(), publisher=pub, nvml=nvml)
    task = await started(runner, stop, after_probe=nvml.driver_down)
    await until(lambda: runner.states["nvml"].failing and runner.states["nvml_xid"].failing, "both failing")
    sent, text = runner.status_sent, exposition(runner)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert sent >= 1 and f'fleetpulse_agent_status_records_total{{host="{HOST}"}} {float(sent)}' in text
    assert f'fleetpulse_agent_collector_failing{{collector="nvml",host="{HOST}"}} 1.0' in text
    assert f'fleetpulse_agent_collector_failing{{collector="nccl_inspector",host="{HOST}"}} 0.0' in text


async def test_the_goodbye_reaches_the_spool_when_the_broker_is_away(tmp_path):
    s = settings(FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{_free_port()}", agent_spool_dir=tmp_path / "spool",
                 agent_shutdown_timeout_s=0.5, agent_stall_after_s=0.5, data_dir=tmp_path / "data")
    nvml, stop = FakeNvml(), asyncio.Event()
    agent = asyncio.create_task(serve(s, stop, nvml=nvml, after_probe=nvml.driver_down))
    spool = tmp_path / "spool"
    await until(lambda: agent.done() or any(spool.glob("seg-*")), "records in the spool", timeout=60)
    await asyncio.sleep(0.3)
    stop.set()
    runner = await asyncio.wait_for(agent, 60)
    records = [r.record for r in Spool(spool).peek(10_000)]
    statuses = [AgentStatus.model_validate(orjson.loads(r.value)) for r in records if r.topic == AGENT.full()]
    assert [r.key for r in records if r.topic == AGENT.full()] == [HOST.encode()] * len(statuses)
    assert statuses and statuses[-1].state == "stopping" and statuses[-1].seq == runner.status_seq - 1
    assert set(statuses[-1].failing) == {"nvml", "nvml_xid"}  # the monitor was broken until the planned stop
    assert not any(r.topic == SAMPLES.full() for r in records)  # NVML down: no samples, only status


async def test_while_a_collector_fails_the_status_comes_every_sample_interval():
    """Then it is the host's only sign of life: at the 60 s period the pipeline would take a broken monitor for a
    silent host (streams/silence/)."""
    nvml, pub, stop = FakeNvml(), Recorder(), asyncio.Event()
    runner = AgentRunner(settings(agent_status_every_s=60, agent_interval_s=0.1), publisher=pub, nvml=nvml)
    task = await started(runner, stop)
    assert runner.status_period_s() == 60
    nvml.driver_down()
    await until(lambda: len([s for s in pub.statuses() if s.failing]) >= 4, "a failing status every interval")
    assert runner.status_period_s() == 0.1
    stop.set()
    await asyncio.wait_for(task, 10)
