"""`fleetpulse up` as a user runs it: every simulated GPU row lands once, the demo's faults raise alerts, a drain and a
return, stragglers are flagged, and query answers afterwards."""

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
    # the default scenario (demo), 180 simulated seconds six times faster than real time
    up = subprocess.run(cli + ["up", "--hosts", "8", "--speed", "6", "--plain"],
                        env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    result = json.loads(up.stdout)
    sim, final = result["simulator"], result["final"]
    assert sim["scenario"] == "demo" and sim["ticks"] == 180 and sim["gpu_readings"] == 8 * 8 * 180
    assert final["rows"]["gpu_samples"] == sim["gpu_readings"]
    # something happens: the overheating GPU alerts, the Xid 119 node is drained, repaired, validated and returned
    # by the simulated bot (drain, repair, validate, undrain), both slow ranks are flagged; the view says so
    assert final["alerts_firing"] >= 2 and final["faults"] >= 1, final
    assert final["drains"] == 1 and final["returns"] == 1 and result["bot_answers"] == 4, result
    assert final["stragglers"] == 2, final
    assert "node       gpu-node-0001 validating -> healthy: validation passed" in up.stderr
    assert "straggler  job-0000 rank 37 on gpu-node-0004" in up.stderr

    query = subprocess.run(cli + ["query", "SELECT count(), uniqExact(ts), count() / uniqExact(ts) FROM gpu_samples"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert query.returncode == 0, query.stderr[-2000:]
    assert query.stdout == "11520\t180\t64\n"  # 8 hosts x 8 GPUs per simulated second, 180 seconds


def test_up_plays_the_demo_by_default_and_baseline_injects_nothing():
    import argparse

    from agents.simulator.scenario import load_scenario
    from fleetpulse.stack import configure_parser

    p = argparse.ArgumentParser()
    configure_parser(p)
    args = p.parse_args([])
    assert args.scenario == "demo" and args.duration is None  # the scenario's own 180 s
    assert [f.kind for f in load_scenario("demo").faults] == ["thermal_runaway", "xid", "slow_rank"]
    baseline = load_scenario("baseline")
    assert baseline.faults == [] and baseline.generate == [] and baseline.bot == {}
