"""Builders of schema-valid host samples for the stream stage tests."""

from __future__ import annotations

import asyncio
import time

from faust.types import Message

from schemas.telemetry import GpuReading, HostSample

H100 = dict(slowdown_temp_c=89.0, shutdown_temp_c=92.0, gpu_max_op_temp_c=87.0, hbm_max_op_temp_c=95.0,
            power_limit_w=700.0)


def gpu(index: int, temp: float | None = 60.0, **fields) -> dict:
    """One GpuReading (validated by the real model) with Hopper limits unless overridden."""
    values = dict(index=index, uuid=f"GPU-{index:04d}", pci_bus_id=f"0000:{index:02x}:00.0", model="H100 SXM",
                  gpu_temp_c=temp, hbm_temp_c=70.0, power_w=450.0, throttle_reasons=0, **H100)
    values.update(fields)
    return GpuReading(**values).model_dump(mode="json")


def sample(host: str, ts: float, gpus: list[dict], *, rack: str = "r1", seq: int = 0) -> dict:
    """A HostSample as the wire carries it (validated, then dumped to plain JSON types)."""
    return HostSample(host=host, rack=rack, cluster="c1", ts=ts, seq=seq, source="simulator",
                      gpus=[GpuReading(**g) for g in gpus]).model_dump(mode="json")


def temps_series(host: str, temps: list[float | None], *, t0: float = 1_000.0, step: float = 5.0,
                 gpu_count: int = 2, hot_gpu: int = 0, rack: str = "r1") -> list[dict]:
    """Samples every `step` s where GPU `hot_gpu` follows `temps` and the other GPUs stay at 55 C."""
    return [sample(host, t0 + i * step, [gpu(g, t if g == hot_gpu else 55.0) for g in range(gpu_count)],
                   rack=rack, seq=i)
            for i, t in enumerate(temps)]


async def until(condition, timeout: float = 10.0, what: str = "condition", every: float = 0.01) -> None:
    """Wait for a stage driven through agent.test_context() (or anything else: `every` s between looks) to reach
    `condition`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met in time"
        await asyncio.sleep(every)


async def put_on(stage, topic: str, value: bytes, key: bytes, partition: int) -> None:
    """Put a record on an agent under test_context() as the consumer would deliver it from `topic` (stage.put names
    no topic when the agent reads several)."""
    channel = stage.stream().channel
    message = Message(topic=topic, partition=partition, offset=stage.sent_offset, timestamp=time.time(),
                      timestamp_type=0, headers=None, key=key, value=value, checksum=b"",
                      generation_id=stage.app.consumer_generation_id)
    stage.sent_offset += 1
    await channel.put(await channel.decode(message))


def drain_changelog(emitter, table: str = "") -> list:
    """The table changelog records the stages sent (of `table`, else of every table) since the last call: taken out of
    the emitter's records (streams.emit.Sent: topic, key, value, partition)."""
    taken = [s for s in emitter.sent if s.topic.endswith("-changelog")]
    emitter.sent[:] = [s for s in emitter.sent if not s.topic.endswith("-changelog")]
    return [s for s in taken if s.topic.endswith(f"{table}-changelog")]
