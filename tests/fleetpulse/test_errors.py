"""A known condition never ends in a traceback: each command run as a newcomer runs it, with the mistake or the
missing service, prints one line that names what to fix and how (issue: the first hour of a user)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_ports


def run(*args: str, env: dict | None = None, tmp_path=None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "KAFKA_", "CLICKHOUSE_"))}
    base |= {"FLEETPULSE_DATA_DIR": str(tmp_path), "FLEETPULSE_LOCAL_KAFKA_PORT": str(free_ports(2)),
             "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT": str(free_ports(1)),
             "FLEETPULSE_LOCAL_CLICKHOUSE_TCP_PORT": str(free_ports(1))}
    return subprocess.run([sys.executable, "-m", "fleetpulse.cli", *args], cwd=REPO, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def said(done: subprocess.CompletedProcess) -> str:
    """The one line the command printed, having failed as it should."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage: "), done.stderr
    return lines[-1]


def test_a_broker_that_does_not_answer_says_how_to_start_it(tmp_path):
    line = said(run("breaker", "status", tmp_path=tmp_path))
    assert line.startswith("fleetpulse breaker: nothing answers on 127.0.0.1:")
    assert "`fleetpulse kafka start`" in line and "KAFKA_BOOTSTRAP_SERVERS" in line


def test_a_json_setting_that_is_not_json_is_named_with_the_parser_s_words(tmp_path):
    line = said(run("bot", "slurm", env={"FLEETPULSE_BOT_SLURM": "{bad"}, tmp_path=tmp_path))
    assert line.startswith("fleetpulse bot: invalid BotSettings: FLEETPULSE_BOT_SLURM (bot_slurm): not valid JSON (")
    assert "give it a JSON object, or unset it" in line


def test_a_store_url_that_is_no_store_is_refused_at_start_up(tmp_path):
    line = said(run("query", "SELECT 1", env={"FLEETPULSE_CLICKHOUSE_URL": "nonsense"}, tmp_path=tmp_path))
    assert "FLEETPULSE_CLICKHOUSE_URL (clickhouse_url)" in line and "'nonsense' is not a store" in line


def test_a_local_server_that_does_not_run_says_how_to_start_it(tmp_path):
    line = said(run("query", "SELECT 1", tmp_path=tmp_path))
    assert line.startswith("fleetpulse query: the local ClickHouse server is not running (nothing answers on ")
    assert "`fleetpulse clickhouse start`" in line and "`./dev up`" in line


@pytest.mark.integration
def test_a_query_before_any_run_says_nothing_is_stored_yet(clickhouse_url, clickhouse_database, tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k.startswith("FLEETPULSE_CLICKHOUSE_")},  # the roles' users
           "FLEETPULSE_CLICKHOUSE_URL": clickhouse_url, "FLEETPULSE_CLICKHOUSE_DATABASE": clickhouse_database}
    from core.clickhouse import connect
    from core.settings import CommonSettings

    if not clickhouse_url.startswith("chdb://"):
        connect(CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database), "owner")
    else:
        env["FLEETPULSE_CLICKHOUSE_URL"] = f"chdb://{tmp_path / 'store'}"  # this process holds the test's store
    line = said(run("query", "SELECT count() FROM gpu_samples", env=env, tmp_path=tmp_path))
    assert line.startswith("fleetpulse query: Code: 60. DB::Exception: Unknown table expression identifier "
                           "'gpu_samples'"), line
    assert line.endswith(f"nothing is stored under that name in {clickhouse_database} yet: `./dev up` (or a running "
                         "sink) stores a run")
    assert "Received ClickHouse exception" not in line and "for url" not in line
    # a syntax error is said about the statement the user typed, at its own positions
    typo = said(run("query", "SELECT count( FROM gpu_samples", env=env, tmp_path=tmp_path))
    assert "Syntax error: failed at position 20 (gpu_samples)" in typo and "'(' at position 13" in typo
    assert "EXPLAIN" not in typo and "FORMAT" not in typo


@pytest.mark.integration
def test_up_whose_store_port_is_taken_says_which_setting_to_change_and_leaves_nothing_running(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("up", "--hosts", "2", "--duration", "5", "--plain", tmp_path=tmp_path,
                   env={"FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT": str(port)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"fleetpulse up: port {port} on 127.0.0.1 is already in use by another process; stop it or choose another "
        "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT")
    assert "stopped the ClickHouse server" not in done.stderr  # it never started
    assert not list(tmp_path.glob("kafka/broker.pid"))  # the broker it started for the run is stopped again


def test_a_flag_a_command_does_not_know_prints_that_command_s_usage(tmp_path):
    done = run("report", "--form", tmp_path=tmp_path)
    assert said(done) == "fleetpulse report: error: unrecognized arguments: --form"
    assert done.stderr.startswith("usage: fleetpulse report ")


def test_dev_names_an_unknown_command():
    done = subprocess.run([str(REPO / "dev"), "tset"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("dev: unknown command 'tset'; the commands are:")
    assert "./dev up" in done.stderr and "./dev test" in done.stderr


def test_the_stream_worker_module_the_children_run_names_a_bad_setting_without_a_traceback(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "KAFKA_", "CLICKHOUSE_"))}
    done = subprocess.run([sys.executable, "-m", "streams.cli", "--worker", "telemetry"], cwd=REPO, text=True,
                          env={**base, "FLEETPULSE_DATA_DIR": str(tmp_path), "FLEETPULSE_STREAMS_BATCH_MAX": "0"},
                          capture_output=True, timeout=120)
    line = said(done)
    assert line.startswith("python -m streams.cli: invalid StreamsSettings: FLEETPULSE_STREAMS_BATCH_MAX"), line
