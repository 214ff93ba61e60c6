"""A worker whose stop is done leaves even when a thread it cannot stop lingers (a consumer thread finishing a group
join it was told to abandon): the process must not wait for it for ever."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import logging, sys, threading
logging.basicConfig(level=logging.INFO)
from streams.faust_adapter.worker import leave_lingering_threads as _leave_lingering_threads
threading.Thread(target=threading.Event().wait, name="stuck-join").start()  # never returns
_leave_lingering_threads(int(sys.argv[1]), grace_s=0.3)
print("not reached")
"""


def test_a_thread_that_never_returns_does_not_hold_the_stopped_worker_and_its_exit_status_stays():
    for code in (0, 1):
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(code)], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == code and time.monotonic() - began < 30
        assert "not reached" not in done.stdout
        assert "1 thread(s) still running 0 s after the stop (stuck-join): leaving without them" in done.stderr


def test_with_no_thread_left_it_returns_as_before():
    done = subprocess.run([sys.executable, "-c", "from streams.faust_adapter.worker import leave_lingering_threads as _leave_lingering_threads; "
                           "_leave_lingering_threads(0, grace_s=0.3); print('returned')"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "returned"
