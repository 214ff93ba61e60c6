"""`fleetpulse up` as a user runs it: every simulated GPU row lands once, and query answers afterwards."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_runs_the_stack_and_leaves_exactly_what_was_simulated(kafka_bootstrap, topic_prefix, tmp_path):
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FLEETPULSE_TOPIC_PREFIX": topic_prefix,
        "FLEETPULSE_DATA_DIR": str(tmp_path / "data"),
        "FLEETPULSE_QUERY_PORT": str(free_port()),
    }
    for var in ("CLICKHOUSE_URL", "FLEETPULSE_CLICKHOUSE_URL", "FLEETPULSE_CLICKHOUSE_DATABASE"):
        env.pop(var, None)  # up owns its embedded store, as on a fresh machine
    cli = [sys.executable, "-m", "fleetpulse.cli"]
    up = subprocess.run(cli + ["up", "--hosts", "6", "--duration", "30", "--speed", "10", "--plain"],
                        env=env, capture_output=True, text=True, timeout=240)
    assert up.returncode == 0, up.stderr[-3000:]
    result = json.loads(up.stdout)
    sim = result["simulator"]
    assert sim["ticks"] == 30 and sim["gpu_readings"] == 6 * 8 * 30
    assert result["final"]["rows"]["gpu_samples"] == sim["gpu_readings"]

    query = subprocess.run(cli + ["query", "SELECT count(), uniqExact(ts), count() / uniqExact(ts) FROM gpu_samples"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert query.returncode == 0, query.stderr[-2000:]
    assert query.stdout == "1440\t30\t48\n"  # 6 hosts x 8 GPUs per simulated second, 30 seconds
