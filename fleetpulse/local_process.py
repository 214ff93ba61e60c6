"""A service the project runs on this machine in a process of its own (the Kafka broker, the ClickHouse server): its
pid file, whether the process named there is still ours, and stopping or killing its process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port (a connect probe never races the process's bind)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class LocalProcess:
    """Subclasses set `pid_file` and `_proc` (the process this object started, if any), and name `_marker()`, what
    their process's command line holds, and `ports()`, where it listens."""

    pid_file: Path
    _proc: subprocess.Popen | None = None

    def _marker(self) -> bytes:
        raise NotImplementedError

    def ports(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._running_pid() is not None

    def stop(self, timeout: float = 30) -> bool:
        """SIGTERM the process group (a clean shutdown), SIGKILL after `timeout`; True if one was running."""
        pid = self._running_pid()
        if pid is None:
            return False
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait
            while self._alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._alive(pid):
                break
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        self._ports_released()
        return True

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash, for tests); its pid, or None if none ran."""
        pid = self._running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while self._alive(pid):
                time.sleep(0.02)
            self.pid_file.unlink(missing_ok=True)
            self._ports_released()
        return pid

    def _ports_released(self, timeout: float = 10) -> None:
        """A process in its exit can read as gone (no command line) a moment before its listeners close."""
        deadline = time.monotonic() + timeout
        while any(listening(port) for port in self.ports()) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _read_pid_file(self) -> dict:
        try:
            return json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return {}

    def _running_pid(self) -> int | None:
        """The pid of our live process; a pid file whose process is gone (or is someone else's) is removed."""
        pid = self._read_pid_file().get("pid")
        if isinstance(pid, int) and self._alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        if Path("/proc/self").exists():  # a reused pid, or a zombie (empty cmdline), is not ours
            try:
                return self._marker() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                return False
        try:  # no /proc (macOS): "the pid exists" is the best we can tell
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
