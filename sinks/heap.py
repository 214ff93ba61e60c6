"""Give the heap's free pages back to the system now and then, so a catch-up's high-water mark does not stay.

What the sink holds per record is its bytes and, for the tables whose rows the engine extracts, one JSON line per host
sample (~11 KB at 8 GPUs): objects too large for Python's small-object arenas, taken from glibc's heap. glibc gives
freed memory in the middle of its heap back only when asked: after the sink caught up a 3-minute backlog of 5,000 hosts
(batches of 50,000 rows) it stayed at 579 MB for good; with malloc_trim every 10 s it went back to 209 MB. Where the C
library has no malloc_trim (musl, macOS) this does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import time


def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrim:
    """`tick()` after each round of the sink's loop: trims at most once per `every_s` seconds."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self.trim = _malloc_trim()
        self.last = time.monotonic()

    @property
    def available(self) -> bool:
        return self.trim is not None

    def tick(self) -> None:
        now = time.monotonic()
        if self.trim is not None and now - self.last >= self.every_s:
            self.last = now
            self.trim(0)
