"""`fleetpulse agent` as operators run it: `--once` diagnostics, and a full run stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest

from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.events import AgentStatus, XidEvent
from schemas.telemetry import HostSample
from schemas.topics import AGENT as STATUS, SAMPLES, XID
from tests.agents.test_publisher import consume_all
from tests.conftest import REPO

AGENT = [sys.executable, "-m", "fleetpulse.cli", "agent"]


def agent_env(tmp_path, **extra) -> dict[str, str]:
    (tmp_path / "kern.log").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    return {**env, "FLEETPULSE_DATA_DIR": str(tmp_path / "data"), "FLEETPULSE_AGENT_HOST": "gpu-node-0100",
            "FLEETPULSE_AGENT_RACK": "r01", "FLEETPULSE_AGENT_KERNEL_LOG": str(tmp_path / "kern.log"), **extra}


def test_once_with_the_fake_nvml_prints_a_valid_sample_and_the_fault(tmp_path):
    done = subprocess.run([*AGENT, "--once", "--fake-nvml", "--fake-fault", "lost:5"], env=agent_env(tmp_path),
                          cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    report = orjson.loads(done.stdout)
    (sample,) = [HostSample.model_validate(s) for s in report[SAMPLES.name]]
    assert (sample.host, sample.rack, sample.source, sample.seq) == ("gpu-node-0100", "r01", "nvml", 0)
    assert [g.index for g in sample.gpus] == [0, 1, 2, 3, 4, 6, 7]  # the lost GPU left the sample ...
    events = [XidEvent.model_validate(e) for e in report[XID.name]]
    assert {(e.code, e.gpu_index, e.message.split(":")[0]) for e in events} == {  # ... and became events
        (79, 5, "NVML gpu_lost"), (79, 5, "NVML XID critical error event")}
    collectors = report["collectors"]
    assert collectors["nvml"]["supported"] and collectors["kernel_log"]["supported"]
    assert collectors["nccl_inspector"] == {"supported": False, "reason": "FLEETPULSE_AGENT_NCCL_DUMP_DIR is not set"}
    (status,) = [AgentStatus.model_validate(s) for s in report[STATUS.name]]  # the agent's own condition: fine
    assert (status.host, status.rack, status.state, status.failing) == ("gpu-node-0100", "r01", "running", {})
    assert "nvml" in status.collectors
    assert status.unsupported["nccl_inspector"] == collectors["nccl_inspector"]["reason"]
    assert not list((tmp_path / "data").glob("spool/seg-*"))  # --once publishes nothing


def test_once_with_nvml_down_reports_a_broken_monitor_not_a_lost_gpu(tmp_path):
    done = subprocess.run([*AGENT, "--once", "--fake-nvml", "--fake-fault", "nvml_down"], env=agent_env(tmp_path),
                          cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    report = orjson.loads(done.stdout)
    assert SAMPLES.name not in report and XID.name not in report  # no sample, no fault event: NVML says nothing
    (status,) = [AgentStatus.model_validate(s) for s in report[STATUS.name]]
    assert set(status.failing) == {"nvml", "nvml_xid"} and status.state == "running"
    assert "NVMLError_DriverNotLoaded" in status.failing["nvml"] and "kernel_log" in status.collectors


@pytest.mark.parametrize(("args", "message"), [
    (["--fake-fault", "lost:1"], "needs --fake-nvml"),
    (["--fake-nvml", "--fake-fault", "melted:1"], "KIND:GPU"),
    (["--fake-nvml", "--fake-fault", "nvml_down:1"], "nvml_down alone"),
    (["--fake-nvml", "--fake-fault", "lost"], "KIND:GPU"),
    (["--collectors", "nvml,gpud"], "unknown collectors ['gpud']"),
    (["--config", "missing.toml"], "cannot read config file"),
])
def test_bad_arguments_stop_the_agent_with_the_reason(tmp_path, args, message):
    done = subprocess.run([*AGENT, "--once", *args], env=agent_env(tmp_path), cwd=tmp_path, capture_output=True,
                          timeout=60)
    assert done.returncode == 2 and message in done.stderr.decode()


def test_once_exits_nonzero_when_no_collector_runs_here(tmp_path):
    done = subprocess.run([*AGENT, "--once", "--collectors", "nccl_inspector"], env=agent_env(tmp_path),
                          cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 1 and orjson.loads(done.stdout)["collectors"]["nccl_inspector"]["supported"] is False


@pytest.mark.integration
async def test_the_agent_runs_until_sigterm_and_stops_cleanly(settings_env, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    env = agent_env(tmp_path, FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap,
                    FLEETPULSE_TOPIC_PREFIX=settings.topic_prefix, FLEETPULSE_AGENT_INTERVAL_S="0.2",
                    FLEETPULSE_AGENT_METRICS_PORT="off")
    proc = subprocess.Popen([*AGENT, "--fake-nvml"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        consumed = asyncio.create_task(consume_all(settings, SAMPLES, 5, timeout=60))
        while not consumed.done():
            assert proc.poll() is None, proc.communicate()[1].decode()  # the agent must not exit on its own
            await asyncio.sleep(0.2)
        samples = consumed.result()
    finally:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert time.monotonic() - started < 15
    assert b"agent stopped: sent" in err and b"0 left in the spool" in err
    assert {HostSample.model_validate_json(r.value).host for r in samples} == {"gpu-node-0100"}
    statuses = [AgentStatus.model_validate_json(r.value) for r in await consume_all(settings, STATUS, 2)]
    assert statuses[0].state == "running" and statuses[-1].state == "stopping"  # the goodbye reached the broker
    assert [s.seq for s in statuses] == list(range(len(statuses))) and statuses[-1].host == "gpu-node-0100"
