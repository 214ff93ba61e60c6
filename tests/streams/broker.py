"""The broker around a worker under test: records produced and read back, a condition waited for, a worker process
stopped, a consumer group empty."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient


def stop_worker(proc: subprocess.Popen, log: Path, *, failing: bool = False) -> None:
    if failing:  # the test already failed: do not hide why behind a shutdown assertion
        proc.kill()
        proc.wait()
        return
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0, f"worker exit {proc.returncode}:\n{log.read_text()[-3000:]}"
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"worker ignored SIGTERM:\n{log.read_text()[-3000:]}") from None


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        return [await producer.send_and_wait(topic, value, key=key) for key, value in records]
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float | None = None) -> list:
    """Every record of `topic` up to its current end, in the order it was written; within `timeout_s`, if given."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end, out = await consumer.end_offsets(tps), []
        left = {tp for tp in tps if end[tp] > 0}
        while left:
            assert deadline is None or time.monotonic() < deadline, f"timed out reading back {topic}"
            for batch in (await consumer.getmany(*left, timeout_ms=500)).values():
                out += batch
            left = {tp for tp in left if await consumer.position(tp) < end[tp]}
        return sorted(out, key=lambda r: (r.timestamp, r.partition, r.offset))
    finally:
        await consumer.stop()


async def wait_for(what: str, probe, timeout: float, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := await probe():
            return result
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{log.read_text()[-4000:]}")


async def group_is_empty(bootstrap: str, group: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
        return all(not g[5] for g in response.groups)  # (error, group, state, protocol type, protocol, members)
    finally:
        await admin.close()
