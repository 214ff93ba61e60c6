"""Reads are guarded wherever they go (fleetpulse/query.py): on a server `fleetpulse query` (and the page, report,
`up` and `evaluate`, which read through it) logs in as the read-only analyst, and ClickHouse itself refuses writes,
DDL, file(), url(), remote(), SYSTEM and oversized answers; on the embedded store, and on a server whose analyst user
could write, the guard of sinks/query_guard.py refuses the same before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pydantic import SecretStr

from core.errors import StoreError
from core.settings import CommonSettings
from fleetpulse.query import query
from sinks.query_guard import QueryRefused
from tests.conftest import REPO, free_ports

pytestmark = pytest.mark.integration

REFUSED = [
    "DROP TABLE gpu_samples",
    "INSERT INTO gpu_samples (host) VALUES ('x')",
    "CREATE TABLE evil (x UInt8) ENGINE = Memory",
    "ALTER TABLE gpu_samples DELETE WHERE 1",
    "SELECT * FROM file('/etc/hostname', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
    "SELECT * FROM remote('127.0.0.1:9000', system.one)",
    "SYSTEM DROP DNS CACHE",
    "SELECT number FROM numbers(50000000)",  # past the analyst's max_result_rows (the test sets 1,000)
]


def fleetpulse_query(env: dict, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetpulse.cli", "query", sql], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def settings(db, clickhouse_url, clickhouse_database, tmp_path):
    """The test's store and database as `fleetpulse query` reads them, the analyst's answers capped at 1,000 rows."""
    return CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database, data_dir=tmp_path,
                          sink_port=free_ports(1), query_max_rows=1000)


def test_a_select_is_answered_as_the_analyst(settings, db):
    db.command("INSERT INTO rack_budgets (rack, budget_w, set_at) VALUES ('r1', 40000, now64(3))")
    assert query(settings, "SELECT rack, budget_w FROM rack_budgets") == b"r1\t40000\n"
    assert query(settings, "SELECT count() FROM rack_budgets FORMAT CSV;") == b"1\n"


@pytest.mark.parametrize("sql", REFUSED)
def test_what_is_not_a_bounded_read_is_refused_with_a_clear_message(settings, db, sql):
    with pytest.raises(StoreError) as refused:
        query(settings, sql)
    said = str(refused.value)
    if settings.embedded_store:  # the guard's refusal, before anything runs
        assert any(why in said for why in ("only SELECT", "not answered here", "TOO_MANY_ROWS", "cannot parse")), said
    else:  # ClickHouse's own, as the read-only analyst
        assert said.startswith("ClickHouse refused it for the read-only analyst (fleetpulse_analyst): Code: "), said
        assert "Not enough privileges" in said or "TOO_MANY_ROWS_OR_BYTES" in said, said
    assert db.query("SELECT count() FROM system.tables WHERE database = currentDatabase() "
                    "AND name IN ('gpu_samples', 'evil')").result_rows == [(1,)]  # nothing dropped or made


def test_the_command_prints_the_refusal_without_a_traceback(settings, clickhouse_url):
    if settings.embedded_store:
        pytest.skip("this test process holds the embedded store; the command's own store: the last test")
    env = {**os.environ, "FLEETPULSE_CLICKHOUSE_URL": clickhouse_url,
           "FLEETPULSE_CLICKHOUSE_DATABASE": settings.clickhouse_database}
    done = fleetpulse_query(env, "DROP TABLE gpu_samples")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("fleetpulse query: ClickHouse refused it for the read-only analyst "
                                  "(fleetpulse_analyst): Code: 497. DB::Exception: fleetpulse_analyst: Not enough "
                                  "privileges. To execute this query, it's necessary to have the grant DROP TABLE ON ")
    assert "Traceback" not in done.stderr
    assert fleetpulse_query(env, "SELECT count() FROM gpu_samples").stdout == "0\n"


def test_an_analyst_user_that_can_write_reads_through_the_guard(settings, db):
    if settings.embedded_store:
        pytest.skip("the embedded store has no users: every read goes through the guard")
    owner = settings.clickhouse_credentials("owner")  # one user for every role, as one URL's user is
    settings = settings.model_copy(update={"clickhouse_analyst_user": owner[0],
                                           "clickhouse_analyst_password": SecretStr(owner[1])})
    assert query(settings, "SELECT currentUser()") == f"{owner[0]}\n".encode()
    with pytest.raises(QueryRefused, match="only SELECT"):
        query(settings, "DROP TABLE gpu_samples")
    with pytest.raises(QueryRefused, match="table function url"):
        query(settings, "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')")
    assert db.query("EXISTS TABLE gpu_samples").result_rows == [(1,)]


@pytest.mark.embedded
def test_the_embedded_store_opened_by_the_command_is_guarded(tmp_path):
    env = {**os.environ, "FLEETPULSE_CLICKHOUSE_URL": f"chdb://{tmp_path / 'store'}", "FLEETPULSE_DATA_DIR":
           str(tmp_path), "FLEETPULSE_SINK_PORT": str(free_ports(1))}  # no sink owns it: the command opens it
    assert fleetpulse_query(env, "SELECT 1 + 1").stdout == "2\n"
    for sql in ("DROP DATABASE default", "SELECT * FROM file('/etc/hostname', 'LineAsString')", "SYSTEM FLUSH LOGS"):
        done = fleetpulse_query(env, sql)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
