"""Shared fixtures: a real Kafka broker (env, testcontainers, or the project's own) and a real ClickHouse engine."""

from __future__ import annotations

import os
import random
import shutil
import socket
import uuid
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("FLEETPULSE_REFERENCE_DIR", REPO.parent / "shared" / "reference"))


def _docker_available() -> bool:
    if not (shutil.which("docker") or os.path.exists("/var/run/docker.sock")):
        return False
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


def require_system(what: str, packages: str, *alternatives: str) -> None:
    """A test that needs a system program (one of `alternatives`) the Python install cannot bring: skipped with the
    line that installs it where it is missing, or failed under CI (FLEETPULSE_TEST_REQUIRE_ALL=1, .ci/run), which
    installs everything and must run every test."""
    if any(shutil.which(name) for name in alternatives):
        return
    message = f"{what} needs {alternatives[0]}: sudo apt-get update && sudo apt-get install -y {packages}"
    if os.environ.get("FLEETPULSE_TEST_REQUIRE_ALL") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_ports(count: int = 1) -> int:
    """A base port with `count` consecutive ports free on loopback, below the kernel's ephemeral range. A port inside
    that range (as binding port 0 gives) can become the source port of some outgoing connection before the broker
    binds it: one node of the test cluster failed so ("Address already in use") and the cluster ran on two."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        base = random.randrange(10_000, low - count)
        if all(_bindable(base + k) for k in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    return free_ports(1)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """Bootstrap servers of a real broker for this test session.

    KAFKA_BOOTSTRAP_SERVERS wins (CI starts the project's broker and exports it); else testcontainers
    when a Docker engine answers; else the project's local broker, started here and stopped after (one per
    pytest-xdist process: a session fixture is per process).
    """
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    if _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:3.9.1").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from fleetpulse.broker import LocalKafka

    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), port=_free_port(), controller_port=_free_port())
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        broker.stop()


@pytest.fixture
def topic_prefix(request):
    """A fresh topic namespace per test, so tests on one broker never see each other's records. Its topics are deleted
    after the test: a broker kept between runs (`./dev fleetpulse kafka start`) would otherwise gather every test's
    partitions until it runs out of open files."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield prefix
    if "kafka_bootstrap" in request.fixturenames:
        _delete_topics(request.getfixturevalue("kafka_bootstrap"), prefix)


def _delete_topics(bootstrap: str, prefix: str) -> None:
    import asyncio

    from core.kafka_admin import delete_prefixed

    try:
        asyncio.run(asyncio.wait_for(delete_prefixed({"bootstrap_servers": bootstrap}, prefix), 20))
    except Exception as exc:  # a test that stopped its broker, or a slow one: the topics stay, the test stands
        warnings.warn(f"topics {prefix}* not deleted: {exc!r}")


STORE = os.environ.get("FLEETPULSE_TEST_STORE", "server")  # the integration tier's store: server or embedded


def pytest_report_header(config) -> str:
    if os.environ.get("CLICKHOUSE_URL"):
        return "store: the ClickHouse server CLICKHOUSE_URL names (tests marked `embedded`: chdb)"
    if STORE == "embedded":
        return "store: embedded chdb, one store per test process (FLEETPULSE_TEST_STORE=embedded)"
    return ("store: the project's local ClickHouse server, one per test process, started and stopped by the tests; "
            "tests marked `embedded` use embedded chdb")


@pytest.fixture(scope="session")
def clickhouse_url(tmp_path_factory):
    """A real ClickHouse for the session: the server CLICKHOUSE_URL names (with the FLEETPULSE_CLICKHOUSE_*_USER and
    _PASSWORD of its roles, else its own user for all); else the project's local server, started here with a user per
    role (their names and passwords exported to this process's environment, where every settings object and every
    child process finds them) and stopped after; or, with FLEETPULSE_TEST_STORE=embedded, one embedded chdb store
    (tests then share the store and isolate by database)."""
    if os.environ.get("CLICKHOUSE_URL"):
        yield os.environ["CLICKHOUSE_URL"]
        return
    if STORE == "embedded":
        yield f"chdb://{tmp_path_factory.mktemp('chdb')}"
        return
    if STORE != "server":
        raise pytest.UsageError(f"FLEETPULSE_TEST_STORE={STORE!r}: server or embedded")
    from core.clickhouse import ROLES
    from fleetpulse.clickhouse_server import LocalClickHouse

    base = free_ports(2)
    server = LocalClickHouse(tmp_path_factory.mktemp("clickhouse"), http_port=base, tcp_port=base + 1)
    url = server.start()
    for role in ROLES:
        os.environ[f"FLEETPULSE_CLICKHOUSE_{role.upper()}_USER"] = server.users[role][0]
        os.environ[f"FLEETPULSE_CLICKHOUSE_{role.upper()}_PASSWORD"] = server.password(role)
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def embedded_clickhouse_url(tmp_path_factory) -> str:
    """An embedded chdb store, for the tests of what only the embedded shape has (one process owns the store and
    answers queries for others). chdb opens one store path per process: tests share it and isolate by database."""
    return f"chdb://{tmp_path_factory.mktemp('chdb')}"


@pytest.fixture
def clickhouse_database(clickhouse_url):
    """A database of this test's own, dropped after it on a server (an embedded store goes with its temporary
    folder; opening it here could meet a child process that holds it)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    if not clickhouse_url.startswith("chdb://"):
        drop_database(clickhouse_url, name)


def drop_database(url: str, name: str) -> None:
    from core.clickhouse import connect
    from core.settings import CommonSettings

    try:
        client = connect(CommonSettings(clickhouse_url=url), "owner", database="system")
        client.command(f"DROP DATABASE IF EXISTS {name} SYNC")
        client.close()
    except Exception as exc:  # a test that stopped the server: the database stays, the test stands
        warnings.warn(f"database {name} not dropped: {exc!r}")


@pytest.fixture
def settings_env(kafka_bootstrap, clickhouse_url, clickhouse_database, topic_prefix, tmp_path, monkeypatch):
    """FLEETPULSE_* variables that point every component at this test's broker namespace and database."""
    env = {
        "FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FLEETPULSE_CLICKHOUSE_URL": clickhouse_url,
        "FLEETPULSE_CLICKHOUSE_DATABASE": clickhouse_database,
        "FLEETPULSE_TOPIC_PREFIX": topic_prefix,
        "FLEETPULSE_DATA_DIR": str(tmp_path / "data"),
        # one telemetry process per worker command, not one per core (the default): tests run two at a time on CI's
        # two cores; tests/streams/test_telemetry_processes.py runs several, and the default's arithmetic
        "FLEETPULSE_STREAMS_TELEMETRY_PROCESSES": "1",
        # a test's sink stores the periodic streams as soon as the events its settings hurry (0.3 s, not the 1 s
        # default: sinks/settings.py); the tests of that wait set it themselves
        "FLEETPULSE_SINK_PERIODIC_BATCH_MAX_SECONDS": "0.3",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def reference_dir() -> Path:
    if not REFERENCE.is_dir():
        pytest.fail(f"reference data missing at {REFERENCE} (set FLEETPULSE_REFERENCE_DIR)")
    return REFERENCE


@pytest.fixture
def db(clickhouse_url, clickhouse_database):
    """A database of this test's own on the real engine, with every table, rollup and view the schemas describe: a
    client of its schema owner (dropped after the test by clickhouse_database)."""
    from core.clickhouse import connect
    from core.settings import CommonSettings
    from sinks import store

    cfg = CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database)
    store.prepare(cfg)
    client = connect(cfg, "owner")
    yield client
    if clickhouse_url.startswith("chdb://"):
        client.command(f"DROP DATABASE IF EXISTS {clickhouse_database}")
