"""The spool's on-disk record format: length- and CRC-framed records, and the scan that finds a torn tail."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

# Frame: payload length, CRC-32 of the payload. Payload: enqueue time, topic length, key length (-1 = no key),
# value length, header count; then topic, key, value, and each header as (name length, value length, name, value).
FRAME = struct.Struct("<II")
HEAD = struct.Struct("<dHiIH")
HEADER = struct.Struct("<HI")
MAX_RECORD = 64 << 20  # a length beyond this is a torn or garbled frame, never a record


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One Kafka record as it will be produced: full topic name, key, value, headers, and when it was enqueued."""

    topic: str
    key: bytes | None
    value: bytes
    ts: float
    headers: tuple[tuple[str, bytes], ...] = ()

    def encode(self) -> bytes:
        topic = self.topic.encode()
        parts = [HEAD.pack(self.ts, len(topic), -1 if self.key is None else len(self.key), len(self.value),
                           len(self.headers)), topic, self.key or b"", self.value]
        for name, value in self.headers:
            raw = name.encode()
            parts += [HEADER.pack(len(raw), len(value)), raw, value]
        payload = b"".join(parts)
        return FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> SpoolRecord:
        ts, tlen, klen, vlen, nheaders = HEAD.unpack_from(payload)
        at = HEAD.size
        topic = payload[at:at + tlen].decode()
        at += tlen
        key = None if klen < 0 else payload[at:at + klen]
        at += max(klen, 0)
        value = payload[at:at + vlen]
        at += vlen
        headers = []
        for _ in range(nheaders):
            nlen, hlen = HEADER.unpack_from(payload, at)
            at += HEADER.size
            headers.append((payload[at:at + nlen].decode(), payload[at + nlen:at + nlen + hlen]))
            at += nlen + hlen
        return cls(topic, key, value, ts, tuple(headers))


@dataclass(frozen=True, slots=True)
class Spooled:
    """A record read by `peek`, with its position: segment, byte offset after it, and its number in the segment."""

    record: SpoolRecord
    segment: int
    end: int
    index: int


def frame_at(data: bytes | memoryview, at: int) -> int | None:
    """The end of the intact frame that starts at `at`, or None: the length must be plausible, the payload's own
    lengths must fit in it, and the CRC must match."""
    if at + FRAME.size + HEAD.size > len(data):
        return None
    length, crc = FRAME.unpack_from(data, at)
    end = at + FRAME.size + length
    if length < HEAD.size or length > MAX_RECORD or end > len(data):
        return None
    _, tlen, klen, vlen, _ = HEAD.unpack_from(data, at + FRAME.size)
    if klen < -1 or HEAD.size + tlen + max(klen, 0) + vlen > length:
        return None
    return end if zlib.crc32(data[at + FRAME.size:end]) == crc else None


@dataclass(frozen=True, slots=True)
class Scan:
    """What a segment file holds: its intact frames as (start, end), and the damaged stretches between them."""

    frames: list[tuple[int, int]]
    damaged: list[tuple[int, int]]

    @property
    def clean(self) -> bool:
        return not self.damaged


def scan(data: bytes) -> Scan:
    """Every intact frame of a segment's bytes. A damaged frame (a flipped byte, a torn write) is skipped by looking
    for the next position where an intact frame starts, so one bad byte costs the records it hit, not the rest of the
    segment; a torn tail is a damaged stretch that reaches the end."""
    view = memoryview(data)
    frames: list[tuple[int, int]] = []
    damaged: list[tuple[int, int]] = []
    at = 0
    while at < len(data):
        end = frame_at(view, at)
        if end is not None:
            frames.append((at, end))
            at = end
            continue
        bad = at
        at += 1
        while at < len(data) and frame_at(view, at) is None:
            at += 1
        damaged.append((bad, at))
    return Scan(frames, damaged)
