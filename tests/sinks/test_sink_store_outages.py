"""The sink against a real ClickHouse server that dies: killed with SIGKILL while every raw topic keeps receiving
records — for 30 s, once in the middle of one of the sink's inserts, and for five minutes (longer than any retry
budget the sink ever had) — and restarted on the same data each time. The one sink process, never restarted, waits
every outage out, says so in its log and on /status, resumes within seconds of each return, and ends with every
record of every topic stored exactly once, in each raw table and in the rollups its views feed."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from aiokafka import AIOKafkaProducer

from core.clickhouse import ROLES, connect
from core.settings import CommonSettings
from fleetpulse.clickhouse_server import LocalClickHouse
from schemas.codec import encode
from schemas.provision import ensure_topics
from schemas.tables import TABLE_BY_TOPIC
from schemas.topics import SAMPLES
from tests.conftest import REPO, free_ports
from tests.hostile_corpus import GOOD
from tests.sinks.test_sink_end_to_end import sample

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SHORT_OUTAGE_S, LONG_OUTAGE_S = 30, 300
HOSTS = 12
BACK_WITHIN_S = 10  # rows flow again this soon after the server answers


def role_env(server: LocalClickHouse) -> dict[str, str]:
    env = {"FLEETPULSE_CLICKHOUSE_URL": server.url}
    for role in ROLES:
        env[f"FLEETPULSE_CLICKHOUSE_{role.upper()}_USER"] = server.users[role][0]
        env[f"FLEETPULSE_CLICKHOUSE_{role.upper()}_PASSWORD"] = server.password(role)
    return env


class Flow:
    """Every raw topic receiving records while the test runs; counts what it sent per table (records, rows)."""

    def __init__(self, settings: CommonSettings, now: float):
        self.settings, self.now = settings, now
        self.others = [topic for topic in GOOD if topic is not SAMPLES]
        self.sent = {topic.name: [0, 0] for topic in GOOD}
        self.samples = 0
        self.stop = asyncio.Event()
        self.burst = 0  # rounds to send at once, without the pause

    async def run(self) -> None:
        producer = AIOKafkaProducer(**self.settings.kafka_client_args(), acks="all", enable_idempotence=True)
        await producer.start()
        draw, seq = random.Random(7), 0
        try:
            while not self.stop.is_set():
                for h in range(HOSTS):
                    await producer.send(SAMPLES.full(self.settings.topic_prefix), encode(sample(h, seq, self.now)),
                                        key=f"h{h:03d}".encode())
                self.samples += HOSTS
                for topic in self.others:
                    record = GOOD[topic](draw, self.now, seq)
                    await producer.send(topic.full(self.settings.topic_prefix), encode(record),
                                        key=topic.key_of(record))
                    self.sent[topic.name][0] += 1
                    self.sent[topic.name][1] += len(TABLE_BY_TOPIC[topic.name].rows(topic.check(record), 0, 0))
                seq += 1
                if self.burst:
                    self.burst -= 1
                else:
                    await asyncio.sleep(0.1)
            await producer.flush()
        finally:
            await producer.stop()
        self.sent[SAMPLES.name] = [self.samples, self.samples * 8]


@pytest.fixture
def server(tmp_path):
    base = free_ports(2)
    server = LocalClickHouse(tmp_path / "clickhouse", http_port=base, tcp_port=base + 1)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def processes():
    """Child processes to kill should the test fail while they run."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_the_sink_outlives_its_server_killed_for_minutes_and_mid_insert(kafka_bootstrap, topic_prefix,
                                                                              tmp_path, server, processes):
    database, sink_port = "outages", free_ports(1)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "CLICKHOUSE_"))},
           **role_env(server), "PYTHONPATH": str(REPO), "FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "FLEETPULSE_TOPIC_PREFIX": topic_prefix, "FLEETPULSE_CLICKHOUSE_DATABASE": database,
           "FLEETPULSE_DATA_DIR": str(tmp_path / "data"), "FLEETPULSE_SINK_PORT": str(sink_port),
           "FLEETPULSE_SINK_BATCH_MAX_SECONDS": "0.3", "FLEETPULSE_SINK_PERIODIC_BATCH_MAX_SECONDS": "0.3",
           "FLEETPULSE_SINK_BATCH_MAX_ROWS": "20000"}
    settings = CommonSettings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix,
                              clickhouse_url=server.url, clickhouse_database=database,
                              clickhouse_owner_user=server.users["owner"][0],
                              clickhouse_owner_password=server.password("owner"))
    await ensure_topics(settings.kafka_client_args(), prefix=topic_prefix)
    flow = Flow(settings, time.time() - 600)
    log_path = tmp_path / "sink.log"
    events: dict = {}
    marks: dict = {}  # the rows stored just before the last kill

    def owner():
        return connect(settings, "owner")

    def stored_samples() -> int:
        try:
            return int(owner().query("SELECT count() FROM gpu_samples").result_rows[0][0])
        except Exception:
            return -1

    def sink_status() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{sink_port}/status", timeout=5) as answer:
            return json.loads(answer.read())

    async def until(check, timeout: float, what: str) -> float:
        began = time.monotonic()
        while not await asyncio.to_thread(check):
            assert sink.poll() is None, f"the sink exited while {what}:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() - began < timeout, f"not {what} within {timeout} s"
            await asyncio.sleep(0.1)
        return time.monotonic() - began

    def storing_again() -> bool:
        """The sink's writes succeed again (its wait ends with a stored insert), and the store's rows grow."""
        return not sink_status()["store"]["waiting"] and stored_samples() > marks.get("before", 0)

    async def outage(name: str, seconds: float) -> None:
        """Kill the server for `seconds` while records keep coming; then how soon rows flow again."""
        marks["before"] = stored_samples()
        server.kill()
        began = time.monotonic()
        await until(lambda: sink_status()["store"]["waiting"], 60, "waiting on the store")
        waiting = sink_status()["store"]
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - began)))
        assert sink.poll() is None and sink_status()["store"]["waiting"]
        await asyncio.to_thread(server.start)
        back = await until(storing_again, BACK_WITHIN_S, f"storing again after {name}")
        events[name] = {"down_s": round(time.monotonic() - began - back, 1), "rows_again_after_s": round(back, 2),
                        "sink_said": waiting["current"]["error"], "paused": sink_status()["store"]}

    with open(log_path, "wb") as log:
        sink = subprocess.Popen([sys.executable, "-m", "fleetpulse.cli", "sink"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(sink)
        flowing = asyncio.create_task(flow.run())
        try:
            await until(lambda: stored_samples() > 0, 120, "storing the first rows")
            await outage("30 s", SHORT_OUTAGE_S)

            # Mid-insert: a burst makes inserts of 20,000 GPU rows; the server dies while one of them runs.
            flow.burst = 400
            mid = {}

            def inserting() -> bool:
                marks["before"] = stored_samples()
                rows = owner().query("SELECT query_id, elapsed, written_rows FROM system.processes "
                                     "WHERE query_kind = 'Insert' AND user = {u:String}",
                                     parameters={"u": server.users["writer"][0]}).result_rows
                if rows:
                    server.kill()
                    mid["insert"] = {"elapsed_s": round(float(rows[0][1]), 3), "written_rows": int(rows[0][2])}
                return bool(rows)

            await until(inserting, 60, "caught inserting")
            await asyncio.sleep(2)
            await asyncio.to_thread(server.start)
            events["mid-insert"] = {**mid, "down_s": 2, "rows_again_after_s": round(await until(
                storing_again, BACK_WITHIN_S, "storing again after the mid-insert kill"), 2)}

            await outage("5 min", LONG_OUTAGE_S)
        finally:
            flow.stop.set()
            await flowing

        # Everything sent is stored once.
        expected = {t: rows for t, (_, rows) in flow.sent.items()}

        def all_stored() -> bool:
            return stored_rows(owner(), flow.sent) == expected

        await until(all_stored, 180, "storing every record")
        status = await asyncio.to_thread(sink_status)
        assert sink.poll() is None, "the one sink process ran throughout"
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(60) == 0
    client = owner()
    for topic, (records, rows) in flow.sent.items():
        table = TABLE_BY_TOPIC[topic].name
        [(n, uniq)] = client.query(f"SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM {table}").result_rows
        assert (n, uniq) == (rows, records), f"{table}: {n} rows of {uniq} records, sent {rows} rows of {records}"
    [(one_minute, one_day)] = client.query("SELECT (SELECT sum(samples) FROM gpu_1m), "
                                           "(SELECT sum(gpu_samples) FROM fleet_1d)").result_rows
    assert one_minute == one_day == flow.samples * 8  # the rollups equal their source
    text = log_path.read_text()
    assert text.count("the store is not taking writes") >= 3 and "still waiting for the store after" in text
    assert "Traceback" not in text
    assert status["store"]["outages"] >= 3 and not status["store"]["waiting"]
    print(json.dumps({"samples": flow.samples, "sent": flow.sent, "outages": events,
                      "sink_store_state": status["store"]}, indent=1))


def stored_rows(client, sent: dict) -> dict[str, int]:
    return {t: int(client.query(f"SELECT count() FROM {TABLE_BY_TOPIC[t].name}").result_rows[0][0]) for t in sent}
