"""Throughput on one data set: raw consume+decode (the ceiling), stream worker, sink, and a bare insert.

    python bench/throughput.py --hosts 200 --ticks 30 [--out bench/results/throughput.json]

Uses KAFKA_BOOTSTRAP_SERVERS when set, else starts the project's local broker in a temporary directory.
Every stage reads the same simulated samples under one fresh topic prefix; figures are medians over
--repeat runs where a stage is repeatable in-process (decode, bare insert), single runs otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.publisher import Publisher
from agents.simulator.runner import FleetSimulator
from fleetpulse.kafka_admin import ensure_topics
from fleetpulse.lag import OffsetWatch
from fleetpulse.settings import CommonSettings
from schemas.tables import TABLES
from schemas.topics import SAMPLES
from sinks import store
from sinks.runner import ClickHouseSink
from sinks.settings import SinkSettings


async def publish(settings: CommonSettings, hosts: int, ticks: int) -> int:
    sim = FleetSimulator(hosts, seed=7, start_ts=time.time() - ticks, nccl_interval=0)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    n = 0
    async with Publisher(settings, client_id="bench") as pub:
        for _ in range(ticks):
            for s in sim.step().samples:
                await pub.send(SAMPLES, s)
                n += 1
        await pub.flush()
    return n


async def consume_raw(settings: CommonSettings, expected: int) -> tuple[float, list]:
    """Seconds to fetch and orjson-decode every sample: the ceiling for any consumer of this topic."""
    consumer = AIOKafkaConsumer(**settings.kafka_client_args(), enable_auto_commit=False, max_poll_records=5000,
                                fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    tps = [TopicPartition(SAMPLES.full(settings.topic_prefix), p) for p in range(SAMPLES.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    decoded, t0 = [], time.perf_counter()
    try:
        while len(decoded) < expected:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                decoded.extend((tp.partition, r.offset, orjson.loads(r.value)) for r in records)
        return time.perf_counter() - t0, decoded
    finally:
        await consumer.stop()


async def stream_worker(settings: CommonSettings, expected: int, env: dict) -> dict:
    """Run `fleetpulse streams` until its group has committed every sample; time from first commit."""
    from streams.app import app_id

    proc = subprocess.Popen([sys.executable, "-m", "fleetpulse.cli", "streams"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watch = OffsetWatch(settings.kafka_client_args(), {SAMPLES.full(settings.topic_prefix): SAMPLES.partitions})
    await watch.start()
    group, topics = app_id(settings.topic_prefix), [SAMPLES.full(settings.topic_prefix)]
    started = time.perf_counter()
    first = None
    try:
        while True:
            lag = await watch.group_lag(group, topics)
            now = time.perf_counter()
            if lag is None:
                lag = expected
            elif first is None and lag < expected:
                first = (now, expected - lag)
            if lag == 0 or now - started > 600:
                break
            await asyncio.sleep(0.25)
        done = time.perf_counter()
    finally:
        await watch.close()
        proc.terminate()
        proc.wait(30)
    if lag:
        return {"error": f"worker still {lag} behind after 600 s"}
    counted = expected - first[1]
    return {"startup_s": round(first[0] - started, 2),
            "samples_per_s": round(counted / max(done - first[0], 1e-9)) if counted else None,
            "note": "rate from the first commit on; commits land every few seconds, so short runs understate it"}


async def sink(settings: CommonSettings, expected_rows: int) -> dict:
    s = SinkSettings(**settings.model_dump(), sink_tables=["gpu_samples"], sink_serve_queries=False)
    sk = ClickHouseSink(s)
    await sk.open_store()
    stop = asyncio.Event()
    stats = sk.stats.tables["gpu_samples"]
    t0 = time.perf_counter()
    task = asyncio.create_task(sk.run(stop))
    while stats.records == 0 and not task.done():  # group join and assignment are start-up, not throughput
        await asyncio.sleep(0.01)
    t1 = time.perf_counter()
    while stats.rows < expected_rows and not task.done():
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t1
    stop.set()
    await task
    return {"rows": stats.rows, "startup_s": round(t1 - t0, 2), "seconds": round(elapsed, 3),
            "rows_per_s": round(expected_rows / elapsed), "batches": stats.batches}, sk


def bare_insert(client, rows: list[tuple], batch_rows: int, repeat: int) -> dict:
    table = TABLES["gpu_samples"]
    times = []
    for _ in range(repeat):
        client.command("TRUNCATE TABLE gpu_samples")
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch_rows):
            client.insert(table.name, rows[i:i + batch_rows], column_names=table.column_names,
                          settings={**store.INSERT_SETTINGS, "insert_deduplication_token": uuid.uuid4().hex})
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"rows_per_s": round(len(rows) / med), "seconds_median": round(med, 3), "repeat": repeat}


async def main(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="fleetpulse-bench-"))
    broker = None
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        from fleetpulse.broker import LocalKafka

        broker = LocalKafka(tmp / "data", port=39092)
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = await asyncio.to_thread(broker.start)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    env = {**os.environ, "FLEETPULSE_TOPIC_PREFIX": prefix, "FLEETPULSE_DATA_DIR": str(tmp / "data"),
           "FLEETPULSE_CLICKHOUSE_URL": f"chdb://{tmp / 'chdb'}"}
    os.environ.update(env)
    settings = CommonSettings()
    try:
        n = await publish(settings, args.hosts, args.ticks)
        decode_times = []
        for _ in range(args.repeat):
            seconds, decoded = await consume_raw(settings, n)
            decode_times.append(seconds)
        rows = [r for part, off, rec in decoded for r in TABLES["gpu_samples"].rows(rec, part, off)]
        raw_s = statistics.median(decode_times)
        worker = await stream_worker(settings, n, env) if not args.skip_streams else None
        sink_result, sk = await sink(settings, len(rows))
        t0 = time.perf_counter()
        for part, off, rec in decoded:
            TABLES["gpu_samples"].rows(rec, part, off)
        rows_s = time.perf_counter() - t0
        bare = await sk.db(bare_insert, sk.client, rows, 50_000, args.repeat)
        return {
            "data": {"hosts": args.hosts, "ticks": args.ticks, "samples": n, "gpu_rows": len(rows),
                     "mean_sample_bytes": round(sum(len(orjson.dumps(r)) for _, _, r in decoded[:200]) / min(200, n))},
            "raw_consume_decode": {"samples_per_s": round(n / raw_s), "rows_per_s": round(len(rows) / raw_s),
                                   "seconds_median": round(raw_s, 3), "repeat": args.repeat},
            "sink_row_extraction": {"rows_per_s": round(len(rows) / rows_s), "seconds": round(rows_s, 3)},
            "stream_worker": worker,
            "sink": sink_result,
            "bare_clickhouse_insert": bare,
            "ratios": {"sink_vs_bare_insert": round(sink_result["rows_per_s"] / bare["rows_per_s"], 3),
                       "sink_vs_raw_decode": round(sink_result["rows_per_s"] / (len(rows) / raw_s), 3)},
        }
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=200)
    p.add_argument("--ticks", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip-streams", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench/results/throughput.json"))
    a = p.parse_args()
    result = asyncio.run(main(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
