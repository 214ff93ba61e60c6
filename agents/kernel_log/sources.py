"""Where kernel-log lines come from: /dev/kmsg records, `journalctl -k -f -o json`, or a rotating log file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

import orjson

_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
JOURNAL_ARGV = ("journalctl", "-k", "-f", "-o", "json", "-n", "0")
RESTART_AFTER_S = 5.0


@dataclass(slots=True)
class Record:
    """One kernel-log record: its text (a multi-line printk keeps its newlines) and its own time, where known."""

    text: str
    ts: float | None = None


def default_boot_time() -> float:
    """Wall-clock time of boot, for kmsg's microseconds-since-boot stamps."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def parse_kmsg_record(raw: str, boot_time: float) -> tuple[int, Record] | None:
    """'6,1234,5678901,-;NVRM: ...' (+ ' KEY=value' dictionary lines) -> (sequence number, record)."""
    header, sep, body = raw.partition(";")
    fields = header.split(",")
    if not sep or len(fields) < 3 or not (fields[1].isdigit() and fields[2].isdigit()):
        return None
    message = body.split("\n ", 1)[0].rstrip("\n")
    if "\\x" in message:  # kmsg escapes newlines, other control bytes and '\' itself as \xNN
        message = _KMSG_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), message)
    return int(fields[1]), Record(message, boot_time + int(fields[2]) / 1e6)


def parse_journal_json(line: str | bytes) -> Record | None:
    """One line of `journalctl -o json` -> record (MESSAGE as text or byte array, __REALTIME_TIMESTAMP in µs)."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    message = entry.get("MESSAGE") if isinstance(entry, dict) else None
    if isinstance(message, list):  # journald sends non-UTF-8 messages as an array of bytes
        message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    stamp = entry.get("__REALTIME_TIMESTAMP")
    return Record(message, int(stamp) / 1e6 if isinstance(stamp, str) and stamp.isdigit() else None)


class KmsgSource:
    """/dev/kmsg, one record per read; starts at the end of the ring unless `replay` (seq gaps count as lost)."""

    kind = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", *, replay: bool = False, boot_time: float | None = None):
        self.path, self.replay = path, replay
        self.boot_time = default_boot_time() if boot_time is None else boot_time
        self.unsupported_reason: str | None = None
        self.lost = 0
        self._fd: int | None = None
        self._buffer = ""
        self._last_seq: int | None = None

    def is_supported(self) -> bool:
        try:
            self._open()
        except OSError as exc:
            self.unsupported_reason = f"cannot read {self.path}: {exc.strerror or exc}"
            return False
        return True

    def _open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if not self.replay:
                os.lseek(self._fd, 0, os.SEEK_END)

    def read(self) -> list[Record]:
        self._open()
        records: list[Record] = []
        while True:
            try:
                chunk = os.read(self._fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the ring overwrote records we had not read yet; the next read resumes
                self.lost += 1
                continue
            if not chunk:
                break
            self._buffer += chunk.decode("utf-8", "replace")
            *complete, self._buffer = re.split(r"\n(?! )", self._buffer)
            for raw in complete:
                if (parsed := parse_kmsg_record(raw, self.boot_time)) is not None:
                    seq, record = parsed
                    if self._last_seq is not None and seq > self._last_seq + 1:
                        self.lost += seq - self._last_seq - 1
                    self._last_seq = seq
                    records.append(record)
        return records

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournaldSource:
    """A `journalctl -k -f -o json` child read without blocking; restarted (at most every 5 s) when it exits."""

    kind = "journald"

    def __init__(self, argv: Sequence[str] = JOURNAL_ARGV, *, restart_after_s: float = RESTART_AFTER_S):
        self.argv = list(argv)
        self.restart_after_s = restart_after_s
        self.unsupported_reason: str | None = None
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._started_at = 0.0

    def is_supported(self) -> bool:
        if shutil.which(self.argv[0]) is None:
            self.unsupported_reason = f"{self.argv[0]} not found"
            return False
        return True

    def _start(self) -> None:
        self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      stdin=subprocess.DEVNULL)
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._started_at = time.monotonic()

    def read(self) -> list[Record]:
        if self._proc is None:
            self._start()
        chunks = []
        while True:
            try:
                chunk = os.read(self._proc.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            if not chunk:  # the child exited; start a new one on a later read
                if time.monotonic() - self._started_at >= self.restart_after_s:
                    self._stop()
                    self.restarts += 1
                break
            chunks.append(chunk)
        *lines, self._buffer = (self._buffer + b"".join(chunks)).split(b"\n")
        return [r for line in lines if line.strip() and (r := parse_journal_json(line)) is not None]

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc.stdout.close()
            self._proc = None

    def close(self) -> None:
        self._stop()


class FileSource:
    """`tail -F` of a log file: new complete lines only, across rotation (new inode) and truncation."""

    kind = "file"

    def __init__(self, path: str | os.PathLike, *, from_start: bool = False):
        self.path, self.from_start = os.fspath(path), from_start
        self.unsupported_reason: str | None = None
        self.rotations = 0
        self._file = None
        self._ino: tuple[int, int] | None = None
        self._buffer = b""
        self._waited = False  # the file was missing once: when it appears, all of it is new

    def is_supported(self) -> bool:
        if not os.access(self.path, os.R_OK):
            self.unsupported_reason = f"cannot read {self.path}"
            return False
        return True

    def _open(self, at_end: bool) -> None:
        self._file = open(self.path, "rb")
        st = os.fstat(self._file.fileno())
        self._ino = (st.st_dev, st.st_ino)
        if at_end:
            self._file.seek(0, os.SEEK_END)

    def read(self) -> list[Record]:
        if self._file is None:
            if not os.path.exists(self.path):
                self._waited = True
                return []
            self._open(at_end=not (self.from_start or self._waited))
        data = self._file.read()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # rotated away and the new file not created yet: stay on the old one
            st = None
        if st is not None and (st.st_dev, st.st_ino) != self._ino:  # rotated: old file finished above, new from 0
            self._file.close()
            self._open(at_end=False)
            self.rotations += 1
            data += self._file.read()
        elif st is not None and st.st_size < self._file.tell():  # truncated in place (copytruncate)
            self._file.seek(0)
            self.rotations += 1
            data += self._file.read()
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        return [Record(line.decode("utf-8", "replace")) for line in lines]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
