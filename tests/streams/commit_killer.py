"""The stream worker, killed by itself (SIGKILL) right after one step of the commit protocol
(streams/runtime/commit.py) on its first batch: `python -m tests.streams.commit_killer STEP fleetpulse-args...`."""

from __future__ import annotations

import inspect
import os
import signal
import sys

from streams.runtime import commit


def killed_after(name: str) -> None:
    """commit()'s step `name` runs, then the process dies before anything else of it does."""
    step = getattr(commit, name)
    if inspect.iscoroutinefunction(step):
        async def then_killed(*args):
            out = await step(*args)
            os.kill(os.getpid(), signal.SIGKILL)
            return out
    else:
        def then_killed(*args):
            out = step(*args)
            os.kill(os.getpid(), signal.SIGKILL)
            return out
    setattr(commit, name, then_killed)


if __name__ == "__main__":
    killed_after(sys.argv[1])
    from fleetpulse.cli import main

    sys.exit(main(sys.argv[2:]))
