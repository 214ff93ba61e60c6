"""The sink gives a catch-up's freed batches back to the system (sinks/heap.py), measured on this process's own heap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sinks.heap import HeapTrim

# A child with a fresh heap: records the size of a host sample's JSON line, one in 16 still held (a batch's neighbours)
# when the rest are freed, as after a catch-up. Resident MB: at the start, after freeing, after a tick inside the
# interval (nothing), after a tick past it.
CHILD = """
import gc, json
from sinks.heap import HeapTrim

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

start = rss()
trim = HeapTrim(every_s=3600)
lines = [b"x" * 11_000 + i.to_bytes(4, "little") for i in range(6_000)]
kept = lines[::16]
del lines
gc.collect()
freed = rss()
trim.tick()
inside = rss()
trim.every_s = 0
trim.tick()
print(json.dumps({"start": start, "freed": freed, "inside": inside, "trimmed": rss(), "kept": len(kept)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not HeapTrim().available,
                    reason="malloc_trim is glibc's; elsewhere the sink does not trim")
def test_freed_lines_stay_resident_until_the_heap_is_trimmed_and_only_once_per_interval():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    mb = json.loads(done.stdout)
    assert mb["freed"] - mb["start"] > 40, mb  # 66 MB of lines, one in 16 held: freeing alone returns little
    assert mb["freed"] - mb["inside"] < 5, mb  # a tick inside the interval does not trim
    assert mb["inside"] - mb["trimmed"] > 40, mb  # past it, the free pages go back
