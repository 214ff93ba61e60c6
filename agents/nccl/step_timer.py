"""StepTimer: a training loop marks its compute and collectives; each collective becomes one NcclTiming record."""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

from schemas.events import NcclTiming


class BufferSink:
    """A bounded, thread-safe hand-off from a training loop to the agent that publishes (drops oldest when full).

    The training thread calls the sink; the agent's event loop calls `drain()` and sends the records, e.g.
    `for t in sink.drain(): await publisher.send(NCCL, t)`.
    """

    def __init__(self, maxlen: int = 65536):
        self._queue: deque[NcclTiming] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.accepted = self.dropped = 0

    def __call__(self, timing: NcclTiming) -> None:
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append(timing)
            self.accepted += 1

    def drain(self, limit: int | None = None) -> list[NcclTiming]:
        with self._lock:
            n = len(self._queue) if limit is None else min(limit, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._queue)


class StepTimer:
    """Per-rank timing of compute between collectives and time inside each collective.

        timer = StepTimer(sink, job="llama-70b", rank=rank, world_size=world, host=socket.gethostname())
        with timer.compute():
            loss = model(batch); loss.backward()
        with timer.collective("AllReduce", grad_bytes):
            dist.all_reduce(grads); torch.cuda.synchronize()   # the block must end when the collective has

    `compute_us` is the time spent in `compute()` blocks since the previous collective; when none were used, the
    wall time since the previous collective ended (since construction for the first). A collective that raises
    produces no record. Timestamps come from the injected clocks (monotonic ns for durations, epoch s for `ts`).
    """

    def __init__(self, sink: Callable[[NcclTiming], None], *, job: str, rank: int, world_size: int, host: str,
                 gpu_index: int | None = None, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 wall: Callable[[], float] = time.time):
        # Validate the constant part once, so a bad job/rank fails here and not on the first step.
        NcclTiming(job=job, rank=rank, world_size=world_size, host=host, gpu_index=gpu_index, collective="init",
                   seq=0, bytes=0, ts=1.0, compute_us=0.0, collective_us=0.0)
        self.sink, self.clock_ns, self.wall = sink, clock_ns, wall
        self._fixed = {"job": job, "rank": rank, "world_size": world_size, "host": host, "gpu_index": gpu_index,
                       "source": "api"}
        self.seq = 0
        self._last_end = clock_ns()
        self._compute_ns = 0
        self._compute_marked = False

    @contextmanager
    def compute(self) -> Iterator[None]:
        start = self.clock_ns()
        try:
            yield
        finally:
            self._compute_ns += self.clock_ns() - start
            self._compute_marked = True

    @contextmanager
    def collective(self, name: str, nbytes: int) -> Iterator[None]:
        ts, start = self.wall(), self.clock_ns()
        yield
        end = self.clock_ns()
        compute_ns = self._compute_ns if self._compute_marked else start - self._last_end
        timing = NcclTiming(collective=name, seq=self.seq, bytes=nbytes, ts=ts, compute_us=max(compute_ns, 0) / 1e3,
                            collective_us=(end - start) / 1e3, **self._fixed)
        self.seq += 1
        self._last_end, self._compute_ns, self._compute_marked = end, 0, False
        self.sink(timing)
