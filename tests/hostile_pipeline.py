"""The hostile corpus through the real stream worker (every stage) and the real sink, counted record by record."""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from core.errors import DecodeError
from core.settings import CommonSettings, load
from schemas.dead_letter import original
from schemas.provision import ensure_topics
from schemas.tables import TABLE_BY_TOPIC
from schemas.topics import AGENT, FAULTS, HOST_EVENTS, NCCL, NET, SAMPLES, XID
from tests.conftest import _free_port
from tests.hostile_corpus import corpus
from tests.pipeline import worker_and_sink
from tests.streams.broker import read_all, wait_for

RAW = (SAMPLES, XID, NCCL, NET, HOST_EVENTS, AGENT)


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MiB; its children's are not included."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def descendants(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids + [k for kid in kids for k in descendants(kid)]


async def through_pipeline(per_topic: int, seed: int, log: Path, timeout: float = 300) -> dict:
    """Publish `per_topic` records per raw topic (about half hostile) and an XID 79 after them; run the worker and
    the sink until every record is stored or dead-lettered and the XID became a fault; return the counts."""
    settings = load(CommonSettings)
    prefix = settings.topic_prefix
    await ensure_topics(settings.kafka_client_args(), prefix)
    records = corpus(per_topic, seed=seed, now=time.time() - 600)
    expected = {t: Counter() for t in RAW}
    refused: dict = {t: {} for t in RAW}  # topic -> {(partition, offset): mutation}
    producer = AIOKafkaProducer(**settings.kafka_client_args(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(h.topic.full(prefix), h.value, key=h.key) for h in records]
        after = {"host": "hostile-0", "ts": time.time() - 60, "code": 79, "gpu_index": 6, "message": "off the bus"}
        await producer.send_and_wait(XID.full(prefix), orjson.dumps(after), key=b"hostile-0")
        metadata = [await f for f in sent]
    finally:
        await producer.stop()
    for h, m in zip(records, metadata):
        try:
            value = h.topic.decode_keyed(h.key, h.value)
        except DecodeError:
            refused[h.topic][(m.partition, m.offset)] = h.how
            continue
        expected[h.topic]["records"] += 1
        expected[h.topic]["rows"] += len(TABLE_BY_TOPIC[h.topic.name].rows(value, 0, 0))
    expected[XID]["records"] += 1
    expected[XID]["rows"] += 1

    async def fault() -> list:
        out = await read_all(settings.bootstrap, FAULTS.full(prefix), FAULTS.partitions)
        return [f for f in map(orjson.loads, (r.value for r in out)) if f["host"] == "hostile-0"
                and f["code"] == "xid:79"]

    port, workers = _free_port(), []
    started = time.monotonic()
    async with worker_and_sink(log, env={"FLEETPULSE_STREAMS_METRICS_PORT": str(port)}, seen=workers) as sink:
        def settled() -> bool:
            stats = sink.stats.tables
            return all(stats[TABLE_BY_TOPIC[t.name].name].rows == expected[t]["rows"]
                       and stats[TABLE_BY_TOPIC[t.name].name].dead_letters == len(refused[t]) for t in RAW)

        async def worker_counted() -> dict:
            text = (await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read())).decode()
            return {t.name: sum(float(v) for v in re.findall(
                rf'^fleetpulse_worker_refused_total{{topic="{re.escape(t.full(prefix))}"}} ([0-9.e+]+)$', text, re.M))
                for t in RAW}

        async def done() -> bool:  # the worker's lanes run apart: its NCCL lane may count after the sink is done
            if not (settled() and await fault()):
                return False
            counted = await worker_counted()
            return all(counted[t.name] >= len(refused[t]) for t in RAW)

        await wait_for("every hostile record stored or dead-lettered, and the XID after them a fault", done, timeout,
                       log)
        seconds = time.monotonic() - started
        counted = await worker_counted()
        worker = workers[0]
        assert worker.poll() is None, f"the worker exited ({worker.returncode}):\n{log.read_text()[-3000:]}"
        rss = {"worker": max(peak_rss_mb(pid) for pid in [worker.pid, *descendants(worker.pid)]),
               "sink_and_test": peak_rss_mb(os.getpid())}
        stats = {t.name: dict(rows=sink.stats.tables[TABLE_BY_TOPIC[t.name].name].rows,
                              dead_letters=sink.stats.tables[TABLE_BY_TOPIC[t.name].name].dead_letters) for t in RAW}
    letters = {t: [original(r.value)[0] for r in await read_all(settings.bootstrap, t.dlq(prefix), 1)] for t in RAW}
    return {"per_topic": per_topic, "seed": seed, "seconds": round(seconds, 1), "stats": stats,
            "expected": {t.name: dict(expected[t], refused=len(refused[t])) for t in RAW},
            "dead_letters": {t.name: sorted((f["partition"], f["offset"]) for f in letters[t]) for t in RAW},
            "refused_at": {t.name: sorted(refused[t]) for t in RAW}, "peak_rss_mb": rss,
            "worker_exit": workers[0].returncode, "worker_refused": counted,
            "mutations": Counter(h.how.split(" ")[0] for h in records if h.how != "good")}
