"""`simulate` end to end on a real broker: exactly one sample per host per tick lands, in per-host order."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

import orjson
import pytest

from agents.simulator import simulate
from core.settings import CommonSettings, load
from schemas.analytics import InjectedFault
from schemas.telemetry import HostSample
from schemas.events import AgentStatus
from schemas.topics import AGENT, NCCL, SAMPLES, TRUTH, XID
from tests.agents.test_publisher import consume_all

pytestmark = pytest.mark.integration


async def test_simulate_publishes_exactly_one_sample_per_host_per_tick(settings_env, tmp_path):
    settings = load(CommonSettings)
    scenario = tmp_path / "lost.json"
    scenario.write_text(json.dumps({"name": "lost", "faults": [
        {"kind": "gpu_lost", "at": 4, "duration": 3, "host": 1, "gpu": 2}]}))
    report = await simulate(settings, hosts=5, duration=10, speed=0, seed=11, scenario=scenario,
                            start_ts=1_700_000_000.0)
    assert report.ticks == 10 and report.gpus == 40 and not report.stopped_early
    assert report.sent == {"fleet.telemetry.samples": 50, "fleet.telemetry.xid": 2,  # one step record per host:
                           "fleet.telemetry.nccl": 7 * 5, "fleet.sim.truth": 1,
                           "fleet.telemetry.agent": 5,  # each agent's status at start (the next is due at 60 s)
                           "fleet.telemetry.net": 5, "fleet.telemetry.host_events": 0}  # ports: at 0 s, next at 30 s
    assert report.nccl_timings == 7 * 40  # the job's collectives stop while a GPU is lost
    assert report.gpu_readings == 50 * 8 - 3  # GPU 2 of host 1 is absent from 3 samples
    samples = await consume_all(settings, SAMPLES, 50)
    assert len(samples) == 50
    assert sum(len(orjson.loads(r.value)["gpus"]) for r in samples) == report.gpu_readings
    seqs = defaultdict(list)
    for record in sorted(samples, key=lambda r: (r.partition, r.offset)):
        sample = HostSample.model_validate_json(record.value, strict=True)
        assert record.key == sample.host.encode()
        seqs[sample.host].append(sample.seq)
    assert seqs == {f"gpu-node-{h:04d}": list(range(10)) for h in range(5)}
    for topic, n in ((XID, 2), (NCCL, 35), (TRUTH, 1)):
        assert len(await consume_all(settings, topic, n)) == n, topic.name
    statuses = await consume_all(settings, AGENT, 5)
    assert sorted(r.key for r in statuses) == [f"gpu-node-{h:04d}".encode() for h in range(5)]
    assert all(AgentStatus.model_validate_json(r.value, strict=True).source == "simulator" for r in statuses)
    (truth,) = await consume_all(settings, TRUTH, 1)
    assert InjectedFault.model_validate_json(truth.value) == report.truth[0]
    assert report.truth[0].kind == "gpu_lost" and report.truth[0].ts == 1_700_000_004.0


async def test_paced_run_keeps_the_rate_and_stops_on_request(settings_env):
    settings = load(CommonSettings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    seen: list[float] = []

    def on_tick(tick, pub):
        seen.append(loop.time())
        if tick.index == 5:
            stop.set()

    began = loop.time()
    report = await simulate(settings, hosts=2, duration=30, speed=5, stop=stop, start_ts=1_700_000_000.0,
                            nccl_interval=0, on_tick=on_tick)
    assert report.stopped_early and report.ticks == 6
    # Ticks are due 0.2 s apart at speed 5: a paced run never runs ahead of its schedule (a late tick may be
    # followed by a prompt one that catches up, so only the lower bound is exact; the upper one is generous).
    assert all(seen[k] - began >= 0.2 * k for k in range(len(seen))), [t - began for t in seen]
    assert seen[-1] - began < 5.0
    assert report.sent["fleet.telemetry.samples"] == 12
    samples = await consume_all(settings, SAMPLES, 12)
    assert sorted({orjson.loads(r.value)["ts"] for r in samples}) == [1_700_000_000.0 + k for k in range(6)]


async def test_a_phased_run_sends_each_host_at_its_own_moment_of_the_interval_stamped_with_it(settings_env):
    settings = load(CommonSettings)
    scenario = {"name": "phased", "run": {"phases": 4}}
    began = time.time()
    report = await simulate(settings, hosts=8, duration=3, interval=1, nccl_interval=1, speed=1, scenario=scenario,
                            start_ts=1_700_000_000.0)
    assert report.sent["fleet.telemetry.samples"] == 24 and report.sent["fleet.telemetry.nccl"] == 24
    samples = [(r.timestamp / 1000, orjson.loads(r.value)) for r in await consume_all(settings, SAMPLES, 24)]
    assert len(samples) == 24
    # host h reports at moment h mod 4 of each 1 s interval, and its sample says so
    assert {(s["host"], s["ts"]) for _, s in samples} == {
        (f"gpu-node-{h:04d}", 1_700_000_000.0 + k + (h % 4) / 4) for h in range(8) for k in range(3)}
    sent_at: dict[float, list[float]] = defaultdict(list)  # a moment -> when its samples went (Kafka time)
    for sent, s in samples:
        sent_at[s["ts"]].append(sent)
        assert sent >= began + s["ts"] - 1_700_000_000.0 - 0.002, (s["host"], s["ts"], sent - began)  # never early
    moments = sorted(sent_at)
    assert all(max(sent_at[a]) < min(sent_at[b]) for a, b in zip(moments, moments[1:]))  # one moment after another
    nccl = [(r.timestamp / 1000, orjson.loads(r.value)["host"]) for r in await consume_all(settings, NCCL, 24)]
    assert max(sent for sent, host in nccl if host.endswith(("3", "7"))) >= began + 2.75 - 0.002
