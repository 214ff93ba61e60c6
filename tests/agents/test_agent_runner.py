"""The agent loop on the real broker with the fake NVML: samples, a lost GPU as an event, kernel-log XIDs, metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.cli import serve
from agents.nvml.fake import FakeNvml
from agents.settings import load_agent_settings
from schemas.provision import ensure_topics
from schemas.events import AgentStatus, XidEvent
from schemas.telemetry import HostSample
from schemas.topics import AGENT, SAMPLES, XID
from tests.agents.test_publisher import consume_all
from tests.conftest import _free_port

pytestmark = pytest.mark.integration
HOST = "gpu-node-0042"
XID_LINE = "NVRM: Xid (PCI:0000:18:00): 48, pid=4242, name=python3, An uncorrectable double bit error"


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(values: dict, name: str, **labels) -> float:
    return values.get((name, tuple(sorted({"host": HOST, **labels}.items()))), 0.0)


def answers(condition) -> bool:
    try:
        return condition()
    except OSError:  # the endpoint is not up yet
        return False


async def until(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(answers, condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.1)


async def test_the_agent_publishes_samples_and_a_lost_gpu_arrives_as_an_event(settings_env, tmp_path):
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    port = _free_port()
    settings = load_agent_settings(agent_host=HOST, agent_rack="r07", agent_cluster="east", agent_job="llama-70b",
                                   agent_collectors="nvml,nvml_xid,kernel_log,dcgm", agent_interval_s=0.2,
                                   agent_event_poll_s=0.05, agent_kernel_log=str(kernel_log), agent_metrics_port=port,
                                   agent_metrics_addr="127.0.0.1", agent_dcgm_url=f"http://127.0.0.1:{_free_port()}/m")
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    nvml, stop = FakeNvml(), asyncio.Event()
    agent = asyncio.create_task(serve(settings, stop, nvml=nvml))
    try:
        published = lambda: metric(scrape(port), "fleetpulse_agent_emitted_total", topic=SAMPLES.name)  # noqa
        await until(lambda: published() >= 3, "three samples acknowledged")
        nvml.lose_gpu(3)  # Xid 79 through NVML events, then GPU_IS_LOST on every call
        with open(kernel_log, "a") as f:
            f.write(f"[ 8123.456789] {XID_LINE}\n")
        await until(lambda: metric(scrape(port), "fleetpulse_agent_emitted_total", topic=XID.name) >= 3,
                    "three XID events acknowledged")
        after_loss = published()
        await until(lambda: published() >= after_loss + 2, "samples after the loss")
        values = scrape(port)
    finally:
        stop.set()
        runner = await asyncio.wait_for(agent, 30)

    assert metric(values, "fleetpulse_agent_collector_up", collector="nvml") == 1
    assert metric(values, "fleetpulse_agent_collector_up", collector="dcgm") == 0  # no exporter: skipped, not fatal
    assert metric(values, "fleetpulse_agent_collector_polls_total", collector="nvml") >= 5
    assert metric(values, "fleetpulse_agent_errors_total", collector="nvml") == 0
    assert metric(values, "fleetpulse_agent_spooled_total") == 0 and metric(values, "fleetpulse_agent_broker_connected")
    assert values[("process_resident_memory_bytes", ())] > 0
    assert runner.states["nvml"].polls >= 5

    samples = [HostSample.model_validate_json(r.value) for r in await consume_all(settings, SAMPLES, 5)]
    labels = {(s.host, s.rack, s.cluster, s.job, s.source) for s in samples}
    assert labels == {(HOST, "r07", "east", "llama-70b", "nvml")}
    assert [s.seq for s in samples] == list(range(len(samples)))  # one key, one partition: in order, no gaps
    assert len(samples[0].gpus) == 8 and len(samples[-1].gpus) == 7
    assert 3 not in {g.index for g in samples[-1].gpus}

    events = [XidEvent.model_validate_json(r.value) for r in await consume_all(settings, XID, 3)]
    by_source = {(e.source, e.code, e.gpu_index): e for e in events}
    lost = by_source[("nvml", 79, 3)]
    assert {e.message.split(":")[0] for e in events if e.source == "nvml"} == {"NVML gpu_lost",
                                                                               "NVML XID critical error event"}
    assert lost.gpu_uuid == nvml.gpus[3]["uuid"] and lost.host == HOST and lost.rack == "r07"
    kernel = next(e for e in events if e.source == "file")
    assert (kernel.code, kernel.pci_bus_id, kernel.pid, kernel.process) == (48, "0000:18:00.0", 4242, "python3")
    assert (kernel.gpu_index, kernel.gpu_uuid) == (0, nvml.gpus[0]["uuid"])  # PCI 18:00 is GPU 0 per NVML
    assert len(events) == 3

    records = await consume_all(settings, AGENT, runner.status_seq)
    assert {r.key for r in records} == {HOST.encode()}
    statuses = [AgentStatus.model_validate_json(r.value) for r in records]
    assert [s.seq for s in statuses] == list(range(runner.status_seq))  # every status, in order, the goodbye last
    assert [s.state for s in statuses] == ["running"] * (len(statuses) - 1) + ["stopping"]
    assert statuses[0].collectors == ["nvml_xid", "nvml", "kernel_log"] and statuses[0].failing == {}
    assert statuses[0].unsupported["dcgm"] and (statuses[0].rack, statuses[0].job) == ("r07", "llama-70b")
