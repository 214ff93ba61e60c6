"""`fleetpulse streams --telemetry-processes 2`: one command, two telemetry processes in the one consumer group, on
the real broker. Each takes a share of the partitions (its own /metrics count above 0 and below all), together every
record, each runaway GPU fires once; SIGTERM to the command stops both cleanly; a child that dies stops the set."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from schemas.analytics import Alert
from schemas.provision import ensure_topics
from schemas.topics import ALERTS, SAMPLES
from streams.groups import group_id
from streams.cli import child_workers, main
from streams.settings import streams_settings, telemetry_processes
from tests.conftest import REPO, free_ports
from tests.streams.test_scale_out import HOSTS, caught_up, counter, members, records_on, runaway
from tests.streams.broker import produce, read_all, stop_worker, wait_for
from tests.streams.test_worker_integration import PHASE1


def test_each_extra_telemetry_process_gets_a_data_directory_of_its_own(tmp_path):
    base = tmp_path / "streams"
    assert child_workers(["telemetry", "decisions"], 3, base) == [
        ("decisions", None), ("telemetry", tmp_path / "streams-1"), ("telemetry", tmp_path / "streams-2")]
    assert child_workers(["decisions"], 3, base) == []  # no telemetry stage chosen: no telemetry process
    assert child_workers(["telemetry", "decisions"], 1, base) == [("decisions", None)]
    assert child_workers(["telemetry"], 2, Path(".")) == [("telemetry", Path(f"{Path.cwd()}-1"))]


def test_by_default_one_process_per_core_at_most_one_per_samples_partition(monkeypatch):
    for cores, expected in ((1, 1), (2, 2), (16, SAMPLES.partitions)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert telemetry_processes(streams_settings(streams_telemetry_processes="auto")) == expected
        assert telemetry_processes(streams_settings(streams_telemetry_processes=3)) == 3


@pytest.mark.parametrize("argv, named", [
    (["--telemetry-processes", "0"], "FLEETPULSE_STREAMS_TELEMETRY_PROCESSES (streams_telemetry_processes)"),
    (["--telemetry-processes", "many"], "FLEETPULSE_STREAMS_TELEMETRY_PROCESSES (streams_telemetry_processes): Value "
                                        "error, a number of processes (1 to 64), or auto"),
    (["--worker", "telemetry", "--telemetry-processes", "2"], "--worker runs exactly one"),
])
def test_a_bad_process_count_fails_at_start_up_with_the_setting_named(argv, named, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETPULSE_DATA_DIR", str(tmp_path))
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def start(tmp: Path, port: int) -> tuple[subprocess.Popen, Path]:
    """The command with power_thermal only (it reads samples and, with rack budgets set, its own rack reports: none
    here), two telemetry processes, /metrics on `port` and the next."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_RACK_")}
    env |= {"PYTHONPATH": str(REPO), "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
            "FLEETPULSE_STREAMS_COMMIT_INTERVAL_S": "0.5", "FLEETPULSE_STREAMS_METRICS_PORT": str(port),
            "FLEETPULSE_STREAMS_METRICS_ADDR": "127.0.0.1"}
    log = tmp / "streams.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streams.cli", "--stages", "power_thermal",
                                 "--telemetry-processes", "2", "--workdir", str(tmp / "streams")], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def kill_all(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the command and its child: one process group
    proc.wait()


@pytest.mark.integration
@pytest.mark.slow
async def test_two_telemetry_processes_from_one_command_share_the_partitions(settings_env, topic_prefix, tmp_path):
    bootstrap = settings_env["FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"]
    await ensure_topics({"bootstrap_servers": bootstrap}, topic_prefix)
    group, t0, port = group_id(topic_prefix, "telemetry"), time.time() - 3600, free_ports(2)
    proc, log = start(tmp_path, port)
    try:
        async def settled() -> bool:
            return await members(bootstrap, group) == 2
        await wait_for("both telemetry processes in the settled group", settled, 90, log)
        await produce(bootstrap, SAMPLES.full(topic_prefix), runaway(PHASE1, 0, t0))

        async def fired() -> bool:
            alerts = await read_all(bootstrap, ALERTS.full(topic_prefix), ALERTS.partitions)
            return sum(Alert.model_validate_json(r.value).alertname == "GpuTempSlowdown" for r in alerts) >= len(HOSTS)
        await wait_for("a firing alert per runaway GPU", fired, 60, log)
        samples = {SAMPLES.full(topic_prefix)}

        async def committed_all() -> bool:
            return await caught_up(bootstrap, group, samples)
        await wait_for("the group to commit every sample", committed_all, 60, log)
        sent = (await records_on(bootstrap, samples))[SAMPLES.full(topic_prefix)]
        assert sent == len(HOSTS) * len(PHASE1)
        got = [counter(p, "received").get("power_thermal", 0) for p in (port, port + 1)]  # the command's, its child's
        # A record fetched again after an assignment is received twice and skipped by the stage as a replay.
        assert sum(got) >= sent, (sent, got)
        assert all(0 < n < sent for n in got), (sent, got)
    except BaseException:
        kill_all(proc)
        raise
    stop_worker(proc, log)  # exit 0 only if its child stopped on the SIGTERM it passed on

    assert (tmp_path / "streams-1").is_dir()  # the child's faust data directory, apart from the command's
    alerts = [Alert.model_validate_json(r.value) for r in await read_all(bootstrap, ALERTS.full(topic_prefix),
                                                                         ALERTS.partitions)]
    assert Counter((a.host, a.gpu_index) for a in alerts if a.alertname == "GpuTempSlowdown") == Counter(
        {(h, 5): 1 for h in HOSTS})


@pytest.mark.integration
@pytest.mark.slow
async def test_a_telemetry_process_that_dies_stops_the_command(settings_env, topic_prefix, tmp_path):
    """For its supervisor to restart the set (exit 1), as with the decisions child."""
    bootstrap = settings_env["FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"]
    await ensure_topics({"bootstrap_servers": bootstrap}, topic_prefix)
    proc, log = start(tmp_path, free_ports(2))
    try:
        async def settled() -> bool:
            return await members(bootstrap, group_id(topic_prefix, "telemetry")) == 2
        await wait_for("both telemetry processes in the settled group", settled, 90, log)
        child = int(re.search(r"started the telemetry worker \(pid (\d+)", log.read_text())[1])
        os.kill(child, signal.SIGKILL)
        rc = proc.wait(timeout=60)
    except BaseException:
        kill_all(proc)
        raise
    assert rc == 1, log.read_text()[-3000:]
    assert f"worker pid {child} exited with -9: stopping this one too" in log.read_text()
