"""The project's local ClickHouse server (fleetpulse/clickhouse_server.py), for real: started from the installed
chdb-core, reached over HTTP and the native protocol like any server, each role's user allowed what its work needs and
refused the rest by ClickHouse itself, its rows kept across a kill and a restart, stopped cleanly."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from core.errors import StoreError
from core.clickhouse import QueryLimits
from fleetpulse.clickhouse_server import LocalClickHouse
from tests.conftest import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = free_ports(2)
    ch = LocalClickHouse(tmp_path_factory.mktemp("ch"), http_port=base, tcp_port=base + 1,
                         limits=QueryLimits(max_rows=1000, max_seconds=5))
    began = time.monotonic()
    ch.start()
    ch.started_in_s = time.monotonic() - began
    for sql in ("CREATE DATABASE roles", "CREATE TABLE roles.t (x UInt32) ENGINE = MergeTree ORDER BY x"):
        assert http(ch, "owner", sql)[0] == 200  # the schema owner may
    yield ch
    assert ch.stop()
    assert not ch.running


def http(ch: LocalClickHouse, role: str | None, sql: str) -> tuple[int, str]:
    """(status, body) of one statement POSTed as `role`'s user (None: `default`, without a password)."""
    user, password = (ch.users[role][0], ch.password(role)) if role else ("default", "")
    request = urllib.request.Request(f"{ch.url}/?user={quote(user)}&password={quote(password)}", data=sql.encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_it_answers_over_http_and_the_native_protocol(server):
    status, body = http(server, "analyst", "SELECT version()")
    assert status == 200 and body.startswith("26.")
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5):
        pass  # clickhouse-client's protocol listens too (the Distributed tables of docs/cluster.md use it)
    print(f"\nstarted in {server.started_in_s:.2f} s, ClickHouse {body.strip()}")


def test_each_role_may_do_its_work(server):
    assert http(server, "owner", "CREATE TABLE roles.work (x UInt32) ENGINE = MergeTree ORDER BY x")[0] == 200
    assert http(server, "writer", "INSERT INTO roles.work SELECT number FROM numbers(10)")[0] == 200
    assert http(server, "writer", "ALTER TABLE roles.work DELETE WHERE x = 0 SETTINGS mutations_sync = 2")[0] == 200
    assert http(server, "analyst", "SELECT count() FROM roles.work") == (200, "9\n")


@pytest.mark.parametrize("role, sql, refusal", [
    ("analyst", "INSERT INTO roles.t VALUES (1)", "grant INSERT"),
    ("analyst", "DROP TABLE roles.t", "grant DROP TABLE"),
    ("analyst", "CREATE TABLE roles.u (x UInt8) ENGINE = Memory", "grant CREATE TABLE"),
    ("analyst", "ALTER TABLE roles.t DELETE WHERE 1", "grant ALTER DELETE"),
    ("analyst", "SELECT * FROM file('/etc/passwd', LineAsString)", "grant READ ON FILE"),
    ("analyst", "SELECT * FROM url('http://127.0.0.1:1/', LineAsString)", "grant READ ON URL"),
    ("analyst", "SELECT * FROM remote('127.0.0.1', system.one)", "grant READ ON REMOTE"),
    ("analyst", "SYSTEM DROP DNS CACHE", "grant SYSTEM DROP DNS CACHE"),
    ("analyst", "SELECT 1 SETTINGS max_execution_time = 600", "shouldn't be greater than 5"),
    ("analyst", "SELECT number FROM numbers(5000)", "TOO_MANY_ROWS_OR_BYTES"),
    ("writer", "CREATE TABLE roles.w (x UInt8) ENGINE = Memory", "grant CREATE TABLE"),
    ("writer", "DROP TABLE roles.t", "grant DROP TABLE"),
    ("writer", "SELECT * FROM url('http://127.0.0.1:1/', LineAsString)", "grant READ ON URL"),
    ("owner", "SELECT * FROM file('/etc/passwd', LineAsString)", "grant READ ON FILE"),
    (None, "SELECT count() FROM roles.t", "grant SELECT"),  # default: chdb's own login, no password, no rights
    (None, "CREATE DATABASE d", "grant CREATE DATABASE"),
])
def test_clickhouse_itself_refuses_what_a_role_may_not_do(server, role, sql, refusal):
    status, body = http(server, role, sql)
    assert status != 200 and refusal in body, body


def test_passwords_are_kept_private_and_only_hashed_in_the_config(server):
    for role in server.users:
        path = server.home / "passwords" / role
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert server.password(role) not in server.config.read_text()
    assert stat.S_IMODE(server.config.stat().st_mode) == 0o600
    log = server.log_file.read_text() + (server.home / "clickhouse.log").read_text()
    assert not any(server.password(role) in log for role in server.users)


def test_rows_survive_a_kill_and_the_restart_is_quick(server):
    assert http(server, "writer", "INSERT INTO roles.t SELECT number + 100 FROM numbers(14)")[0] == 200
    killed = server.kill()
    assert killed is not None and not server.running
    began = time.monotonic()
    server.start()
    print(f"\nrestarted on the same data in {time.monotonic() - began:.2f} s")
    assert http(server, "analyst", "SELECT count() FROM roles.t") == (200, "14\n")


def test_a_second_start_finds_it_running(server):
    pid = server.status()["pid"]
    assert server.start() == server.url and server.status()["pid"] == pid
    assert server.status()["ready"] and server.status()["version"].startswith("26.")


def test_a_port_in_use_stops_the_start_with_the_setting_to_change(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ch = LocalClickHouse(tmp_path, http_port=port, tcp_port=free_ports(1))
        with pytest.raises(StoreError, match=f"port {port} .* FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT"):
            ch.start()
    assert not ch.running


def test_the_cli_starts_reports_and_stops_it(tmp_path):
    base = free_ports(2)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_CLICKHOUSE", "CLICKHOUSE"))},
           "FLEETPULSE_DATA_DIR": str(tmp_path), "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT": str(base),
           "FLEETPULSE_LOCAL_CLICKHOUSE_TCP_PORT": str(base + 1)}

    def fleetpulse(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fleetpulse.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120)

    try:
        started = fleetpulse("clickhouse", "start")
        assert started.returncode == 0 and started.stdout.strip() == f"http://127.0.0.1:{base}", started.stderr
        status = fleetpulse("clickhouse", "status")
        assert status.returncode == 0 and '"ready": true' in status.stdout
        assert "fleetpulse_analyst" in status.stdout and (tmp_path / "clickhouse" / "passwords" / "analyst").exists()
        password = (tmp_path / "clickhouse" / "passwords" / "analyst").read_text().strip()
        assert password not in status.stdout + status.stderr + started.stderr
        # any fleetpulse command finds the local server and its users from the settings alone
        asked = fleetpulse("query", "SELECT currentUser()")
        assert asked.returncode == 0 and asked.stdout == "fleetpulse_analyst\n", asked.stderr
    finally:
        stopped = fleetpulse("clickhouse", "stop")
    assert stopped.stdout.strip() == "stopped"
    assert fleetpulse("clickhouse", "status").returncode == 1
    down = fleetpulse("query", "SELECT 1")
    assert down.returncode == 2 and "fleetpulse clickhouse start" in down.stderr and "Traceback" not in down.stderr
