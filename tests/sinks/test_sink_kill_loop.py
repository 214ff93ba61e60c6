"""The sink killed with SIGKILL ten times at random points while every raw topic keeps receiving records: restarted
each time on the same embedded store (the shape where the sink process owns the store and answers for it), it ends
with every record of every topic stored exactly once (nothing lost, nothing doubled), in each raw table and in the
rollups its views feed. The same against a server killed under the sink: tests/sinks/test_sink_store_outages.py."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaProducer

from core.settings import CommonSettings, load
from fleetpulse.query import ask_owner
from schemas.codec import encode
from schemas.provision import ensure_topics
from schemas.tables import TABLE_BY_TOPIC
from schemas.topics import SAMPLES
from tests.conftest import REPO, _free_port
from tests.hostile_corpus import GOOD
from tests.sinks.test_sink_end_to_end import sample

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.embedded]
KILLS, SAMPLES_TOTAL = 10, 3000


def start_sink(env: dict, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fleetpulse.cli", "sink"], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


async def test_the_sink_killed_ten_times_while_data_flows_loses_and_doubles_nothing(settings_env, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETPULSE_CLICKHOUSE_URL": f"chdb://{tmp_path / 'store'}",
           "FLEETPULSE_SINK_PORT": str(port), "FLEETPULSE_SINK_BATCH_MAX_SECONDS": "0.2",
           "FLEETPULSE_SINK_BATCH_MAX_ROWS": "2000"}
    asking = settings.model_copy(update={"sink_port": port})
    now = time.time() - 600

    others = [topic for topic in GOOD if topic is not SAMPLES]
    sent = {topic.name: [0, 0] for topic in GOOD}  # records, rows

    async def publish() -> None:
        producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
        await producer.start()
        draw = random.Random(5)
        try:
            for seq in range(SAMPLES_TOTAL // 12):
                for h in range(12):
                    await producer.send(SAMPLES.full(settings.topic_prefix), encode(sample(h, seq, now)),
                                        key=f"h{h:03d}".encode())
                for topic in others:  # one record of each other raw topic per round
                    record = GOOD[topic](draw, now, seq)
                    await producer.send(topic.full(settings.topic_prefix), encode(record),
                                        key=topic.key_of(record))
                    sent[topic.name][0] += 1
                    sent[topic.name][1] += len(TABLE_BY_TOPIC[topic.name].rows(topic.check(record), 0, 0))
                await asyncio.sleep(0.06)
            await producer.flush()
        finally:
            await producer.stop()
        sent[SAMPLES.name] = [SAMPLES_TOTAL, SAMPLES_TOTAL * 8]

    def table_counts() -> str:
        return " UNION ALL ".join(f"SELECT '{t}', count(), uniqExact(kafka_partition, kafka_offset) FROM "
                                  f"{TABLE_BY_TOPIC[t].name}" for t in sent)

    rng = random.Random(11)
    flowing = asyncio.create_task(publish())
    with open(tmp_path / "sink.log", "ab") as log:
        for k in range(KILLS):
            proc = start_sink(env, log)
            await asyncio.sleep(rng.uniform(0.5, 4.0))  # at start-up, mid-batch, between insert and commit, ...
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        await flowing
        proc = start_sink(env, log)
        try:
            deadline, counts, rollups = time.monotonic() + 120, None, None
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                assert proc.poll() is None, (tmp_path / "sink.log").read_text()[-3000:]
                answer = await asyncio.to_thread(ask_owner, asking, "SELECT count(), uniqExact(kafka_partition, "
                                                 "kafka_offset), uniqExact(host, seq, gpu_index) FROM gpu_samples")
                counts = tuple(int(v) for v in answer.split()) if answer else None
                stored = await asyncio.to_thread(ask_owner, asking, table_counts())
                tables = {t: [int(n), int(r)] for t, n, r in (ln.split("\t") for ln in stored.decode().splitlines())} \
                    if stored else {}
                if counts and counts[0] >= SAMPLES_TOTAL * 8 and all(tables.get(t, [0])[0] >= rows
                                                                      for t, (_, rows) in sent.items()):
                    # an insert's raw part is visible before its views' parts: wait for the last one's rollups too
                    answer = await asyncio.to_thread(ask_owner, asking, "SELECT (SELECT sum(samples) FROM gpu_1m), "
                                                     "(SELECT sum(gpu_samples) FROM fleet_1d)")
                    rollups = tuple(int(v) for v in answer.split())
                    if rollups >= (SAMPLES_TOTAL * 8,) * 2:
                        break
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, (tmp_path / "sink.log").read_text()[-3000:]
    # every row once: 8 GPUs per sample, each sample's record once, each (host, seq, GPU) once
    assert counts == (SAMPLES_TOTAL * 8, SAMPLES_TOTAL, SAMPLES_TOTAL * 8)
    assert rollups == (SAMPLES_TOTAL * 8,) * 2  # and so did the rollups
    # every other raw table too: its rows once, each record's (partition, offset) once
    assert {t: [rows, records] for t, (records, rows) in sent.items()} == tables
