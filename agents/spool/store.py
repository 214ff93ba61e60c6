"""Spool: a bounded on-disk queue of Kafka records in segment files that outlives broker outages and restarts."""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agents.spool.record import FRAME, Spooled, SpoolRecord, frame_at, scan
from core.errors import ConfigError

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
CURSOR = "cursor.json"


class SpoolUnwritable(Exception):
    """The disk refused a record (full, quota, I/O error); the spool is as it was before the append."""


@dataclass
class _Segment:
    """One segment file and how much of it was delivered."""

    id: int
    path: Path
    size: int = 0  # bytes on disk
    records: int = 0  # frames in the file
    consumed: int = 0  # byte offset of the first record not yet delivered
    consumed_records: int = 0

    @property
    def pending(self) -> int:
        return self.records - self.consumed_records


class Spool:
    """Records in order across `seg-<id>.spool` files under `directory`, at most `max_bytes` on disk.

    `append` adds at the tail; when the limit would be passed, the oldest whole segments are deleted and their
    undelivered records counted in `dropped`. `peek` reads from the oldest undelivered record and `commit` marks a
    prefix delivered (persisted in cursor.json, so a restart replays only what was not delivered). Every read checks
    each frame's CRC: a damaged stretch (a torn write left by a crash, a flipped byte) is skipped by resynchronising on
    the next intact frame and the segment rewritten without it, so only the damaged records are lost (`corrupt`
    counts the stretches). A disk that refuses an append (full, quota) raises SpoolUnwritable and leaves the spool as
    it was; a cursor that cannot be written is retried at the next commit (a restart meanwhile replays, never loses).
    Durability (`fsync`): "always" syncs every append and commit (survives power loss, costs a disk flush each);
    "interval" syncs at most every `fsync_interval_s` and on rotate/close (a process crash loses nothing, a power
    loss at most that interval); "never" leaves it to the OS. Appends are unbuffered writes, so a killed process
    never loses an appended record. One process per directory (an exclusive lock).
    """

    def __init__(self, directory: str | os.PathLike, *, max_bytes: int = 256 << 20, segment_bytes: int | None = None,
                 fsync: FsyncPolicy = "interval", fsync_interval_s: float = 1.0):
        if fsync not in ("always", "interval", "never"):
            raise ConfigError(f"spool fsync policy must be always, interval or never, not {fsync!r}")
        if max_bytes < 4096:
            raise ConfigError(f"spool max_bytes must be at least 4096, not {max_bytes}")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes or 8 << 20, max_bytes // 4)
        self.fsync, self.fsync_interval_s = fsync, fsync_interval_s
        self.appended = self.dropped = self.corrupt = self.cursor_errors = 0
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ConfigError(f"spool {self.dir} is in use by another process") from None
        self._segments: dict[int, _Segment] = {}
        self._fd: int | None = None
        self._dirty = False
        self._synced_at = time.monotonic()
        self._recover()

    # -- reading the state a previous run left -----------------------------------------------------------------------
    def _recover(self) -> None:
        try:
            cursor = {int(k): v for k, v in json.loads((self.dir / CURSOR).read_text()).items()}
        except FileNotFoundError:
            cursor = {}
        except (ValueError, AttributeError, OSError) as exc:  # unreadable cursor: replay everything (may duplicate)
            log.warning("spool %s: ignoring unreadable %s (%s); undelivered-or-not records will be replayed",
                        self.dir, CURSOR, exc)
            cursor = {}
        for path in self.dir.glob("seg-*.spool"):
            try:
                seg = _Segment(int(path.stem[4:]), path)
            except ValueError:
                continue
            offset = cursor.get(seg.id, 0)
            self._load(seg, offset if isinstance(offset, int) else 0)
            self._segments[seg.id] = seg
        self._next_id = max(self._segments, default=-1) + 1
        self._forget_delivered()  # also rewrites the cursor without entries of segments that are gone
        if self._segments:
            log.info("spool %s: %d records (%d bytes) left by a previous run", self.dir, len(self), self.bytes)

    def _load(self, seg: _Segment, consumed: int) -> None:
        """Read a segment's frames (`consumed`: the byte offset delivered up to, in the file as it is); a damaged
        segment is rewritten with its intact frames only, and the delivered ones stay delivered."""
        data = seg.path.read_bytes()
        found = scan(data)
        seg.consumed_records = sum(1 for _, end in found.frames if end <= consumed)
        ends = [end for _, end in found.frames]
        if not found.clean:
            self.corrupt += len(found.damaged)
            lost = sum(b - a for a, b in found.damaged)
            log.warning("spool %s: skipped %d damaged stretch(es), %d bytes (kept %d intact records)", seg.path,
                        len(found.damaged), lost, len(found.frames))
            if self._fd is not None and self._segments and seg.id == max(self._segments):
                os.close(self._fd)  # appends would go on into the replaced file: the next one rotates
                self._fd = None
            tmp = seg.path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(b"".join(data[a:b] for a, b in found.frames))
                if self.fsync != "never":
                    os.fsync(f.fileno())
            os.replace(tmp, seg.path)
            ends = list(itertools.accumulate(b - a for a, b in found.frames))  # where they end in the new file
        seg.size, seg.records = (ends[-1] if ends else 0), len(ends)
        seg.consumed = ends[seg.consumed_records - 1] if seg.consumed_records else 0

    # -- writing ---------------------------------------------------------------------------------------------------
    def append(self, record: SpoolRecord) -> None:
        """Add at the tail (after dropping the oldest segments if the limit would be passed)."""
        frame = record.encode()
        if len(frame) > self.max_bytes // 4:
            raise ValueError(f"record of {len(frame)} bytes exceeds a quarter of the spool ({self.max_bytes} bytes)")
        try:
            tail = self._segments[max(self._segments)] if self._segments else None
            if tail is None or self._fd is None or (tail.size + len(frame) > self.segment_bytes and tail.records):
                tail = self._rotate()
            self._make_room(len(frame))
            self._write_all(tail, frame)
        except OSError as exc:
            raise SpoolUnwritable(f"spool {self.dir}: {exc.strerror or exc}") from exc
        tail.size += len(frame)
        tail.records += 1
        self.appended += 1
        self._written()

    def _write_all(self, tail: _Segment, frame: bytes) -> None:
        """The whole frame or nothing: a short write is continued, a failed one cut back off the segment."""
        done = 0
        try:
            while done < len(frame):
                done += os.write(self._fd, frame[done:])
        except OSError:
            if done:
                os.ftruncate(self._fd, tail.size)
            raise

    def prepend(self, records: list[SpoolRecord]) -> None:
        """Put records before everything spooled (records that left for the broker earlier and came back)."""
        if not records:
            return
        if not self._segments:
            for record in records:
                self.append(record)
            return
        seg = _Segment(min(self._segments) - 1, self.dir / f"seg-{min(self._segments) - 1}.spool")
        data = b"".join(r.encode() for r in records)
        try:
            with open(seg.path, "wb") as f:
                f.write(data)
                if self.fsync != "never":
                    os.fsync(f.fileno())
        except OSError as exc:
            seg.path.unlink(missing_ok=True)
            raise SpoolUnwritable(f"spool {self.dir}: {exc.strerror or exc}") from exc
        seg.size, seg.records = len(data), len(records)
        self._segments[seg.id] = seg
        self.appended += len(records)
        self._make_room(0)

    def _rotate(self) -> _Segment:
        if self._fd is not None:
            self._sync_file()
            os.close(self._fd)
            self._fd = None
        new_id = self._next_id
        seg = _Segment(new_id, self.dir / f"seg-{new_id}.spool")
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._next_id, self._segments[new_id] = new_id + 1, seg
        if self.fsync != "never":
            self._sync_dir()
        return seg

    def _make_room(self, incoming: int) -> None:
        tail = max(self._segments)
        while self.bytes + incoming > self.max_bytes and min(self._segments) != tail:
            oldest = self._segments[min(self._segments)]
            self.dropped += oldest.pending
            log.warning("spool %s full: dropped the oldest %d records", self.dir, oldest.pending)
            self._delete(oldest)
            self._write_cursor()

    # -- reading and acknowledging ---------------------------------------------------------------------------------
    def peek(self, max_records: int = 500, max_bytes: int = 4 << 20) -> list[Spooled]:
        """The oldest undelivered records, in order, without removing them. Each frame's CRC is checked: a segment
        found damaged is repaired (_load) and read again, once."""
        out: list[Spooled] = []
        budget = max_bytes
        for seg in [self._segments[i] for i in sorted(self._segments)]:
            for attempt in (0, 1):
                if seg.pending == 0:
                    break
                with open(seg.path, "rb") as f:
                    f.seek(seg.consumed)
                    data = f.read(seg.size - seg.consumed)
                at, index, damaged = 0, seg.consumed_records, False
                while index < seg.records and len(out) < max_records and (budget > 0 or not out):
                    end = frame_at(data, at)
                    if end is None:
                        damaged = True
                        break
                    index += 1
                    out.append(Spooled(SpoolRecord.decode(data[at + FRAME.size:end]), seg.id, seg.consumed + end,
                                       index))
                    budget, at = budget - (end - at), end
                if not damaged:
                    break
                if out and out[-1].segment == seg.id:
                    return out  # deliver what was intact before the damage; the next peek repairs it
                if attempt:
                    return out  # damaged again right after its repair (a failing disk): stop here, in order
                self._load(seg, seg.consumed)
            if len(out) >= max_records or budget <= 0:
                break
        return out

    def commit(self, upto: Spooled) -> None:
        """Everything up to and including `upto` was delivered; a segment dropped meanwhile is simply gone."""
        for seg in [self._segments[i] for i in sorted(self._segments) if i <= upto.segment]:
            if seg.id < upto.segment:
                seg.consumed, seg.consumed_records = seg.size, seg.records
            elif upto.end > seg.consumed:
                seg.consumed, seg.consumed_records = upto.end, upto.index
        self._forget_delivered()

    def _forget_delivered(self) -> None:
        """Delete fully delivered segments (the tail too once nothing is left) and persist the cursor."""
        for seg in [self._segments[i] for i in sorted(self._segments)]:
            if seg.pending == 0 and (seg.id != max(self._segments) or len(self) == 0):
                self._delete(seg)
        self._write_cursor()

    def _write_cursor(self) -> None:
        state = {str(s.id): s.consumed for s in self._segments.values() if s.consumed}
        tmp = self.dir / (CURSOR + ".tmp")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(state))
                if self.fsync != "never":  # the rename below is made durable by the next directory sync
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.dir / CURSOR)
        except OSError as exc:  # a full disk: the next commit writes it again; a restart meanwhile replays more
            self.cursor_errors += 1
            log.warning("spool %s: cannot write %s (%s); delivered records may be replayed after a restart",
                        self.dir, CURSOR, exc.strerror or exc)
            return
        self._written()

    def _delete(self, seg: _Segment) -> None:
        if seg.id == max(self._segments) and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        seg.path.unlink(missing_ok=True)
        del self._segments[seg.id]

    # -- durability ------------------------------------------------------------------------------------------------
    def _written(self) -> None:
        self._dirty = True
        if self.fsync == "always" or (self.fsync == "interval" and
                                      time.monotonic() - self._synced_at >= self.fsync_interval_s):
            self.sync()

    def sync(self) -> None:
        """Flush appended records and the cursor to stable storage (the "interval" policy calls this on its own)."""
        if self._dirty and self.fsync != "never":
            self._sync_file()
            self._sync_dir()
        self._dirty, self._synced_at = False, time.monotonic()

    def sync_due(self) -> None:
        """Sync if the interval policy's time has come (called by the publisher's pump, so idle data gets synced)."""
        if self.fsync == "interval" and self._dirty and time.monotonic() - self._synced_at >= self.fsync_interval_s:
            self.sync()

    def _sync_file(self) -> None:
        if self._fd is not None and self.fsync != "never":
            os.fsync(self._fd)

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- state -----------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(s.pending for s in self._segments.values())

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def close(self) -> None:
        if self._lock.closed:
            return
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
