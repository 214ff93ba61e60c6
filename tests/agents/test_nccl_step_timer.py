"""StepTimer and BufferSink: compute and collective times from injected clocks, the hand-off to the publisher."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from agents.nccl import BufferSink, StepTimer
from schemas.events import NcclTiming


class FakeClock:
    """Monotonic nanoseconds moved by hand; `wall` is the matching epoch time."""

    def __init__(self):
        self.ns = 5_000_000_000

    def __call__(self) -> int:
        return self.ns

    def wall(self) -> float:
        return 1_760_000_000.0 + self.ns / 1e9

    def run(self, us: float) -> None:
        self.ns += int(us * 1000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def timer(sink, clock, **kw) -> StepTimer:
    return StepTimer(sink, job="llama-70b", rank=3, world_size=64, host="gpu-node-0001", gpu_index=3,
                     clock_ns=clock, wall=clock.wall, **kw)


def test_compute_blocks_then_collective(clock):
    out: list[NcclTiming] = []
    t = timer(out.append, clock)
    clock.run(5_000)  # data loading: not inside compute()
    with t.compute():
        clock.run(600_000)
    clock.run(1_000)
    with t.compute():
        clock.run(50_000)
    start_wall = clock.wall()
    with t.collective("AllReduce", 1 << 30):
        clock.run(42_000)
    (rec,) = out
    assert (rec.compute_us, rec.collective_us, rec.ts) == (650_000.0, 42_000.0, start_wall)
    assert (rec.job, rec.rank, rec.world_size, rec.host, rec.gpu_index) == ("llama-70b", 3, 64, "gpu-node-0001", 3)
    assert (rec.collective, rec.bytes, rec.seq, rec.source) == ("AllReduce", 1 << 30, 0, "api")
    NcclTiming.model_validate_json(rec.model_dump_json(), strict=True)


def test_without_compute_blocks_the_gap_since_the_previous_collective_counts(clock):
    out: list[NcclTiming] = []
    t = timer(out.append, clock)
    clock.run(300)
    with t.collective("AllGather", 4096):
        clock.run(20)
    clock.run(700)
    with t.collective("ReduceScatter", 4096):
        clock.run(30)
    with t.collective("AllGather", 4096):  # back to back: no compute in between
        clock.run(25)
    assert [(r.seq, r.collective, r.compute_us, r.collective_us) for r in out] == [
        (0, "AllGather", 300.0, 20.0), (1, "ReduceScatter", 700.0, 30.0), (2, "AllGather", 0.0, 25.0)]


def test_a_failed_collective_produces_no_record(clock):
    out: list[NcclTiming] = []
    t = timer(out.append, clock)
    with pytest.raises(RuntimeError):
        with t.collective("AllReduce", 8):
            raise RuntimeError("NCCL watchdog timeout")
    assert out == [] and t.seq == 0


def test_bad_constants_fail_at_construction(clock):
    with pytest.raises(ValidationError):
        StepTimer(list().append, job="", rank=0, world_size=1, host="h", clock_ns=clock, wall=clock.wall)
    with pytest.raises(ValidationError):
        StepTimer(list().append, job="j", rank=0, world_size=0, host="h", clock_ns=clock, wall=clock.wall)
    with pytest.raises(ValidationError):
        with timer(list().append, clock).collective("AllReduce", -1):
            pass


def test_buffer_sink_is_bounded_and_thread_safe(clock):
    sink = BufferSink(maxlen=1000)
    timers = [timer(sink, FakeClock()) for _ in range(4)]

    def loop(t: StepTimer) -> None:
        for _ in range(500):
            with t.collective("AllReduce", 1024):
                pass

    threads = [threading.Thread(target=loop, args=(t,)) for t in timers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sink.accepted == 2000 and sink.dropped == 1000 and len(sink) == 1000
    first = sink.drain(limit=10)
    assert len(first) == 10 and len(sink.drain()) == 990 and sink.drain() == []


def test_cheap_enough_for_every_step():
    sink = BufferSink(maxlen=10)
    t = StepTimer(sink, job="j", rank=0, world_size=8, host="h")
    n = 5000
    start = time.process_time()
    for _ in range(n):
        with t.compute():
            pass
        with t.collective("AllReduce", 1 << 20):
            pass
    per_step_us = (time.process_time() - start) / n * 1e6
    assert per_step_us < 100  # measured ~8 us; a training step is milliseconds
