"""The spool's on-disk record format: length- and CRC-framed records, and the scan that finds a torn tail."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

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


def scan(path: Path) -> tuple[list[int], int]:
    """(end offset of every intact frame, bytes after the last intact frame): a torn or garbled tail is not a frame."""
    data = path.read_bytes()
    ends, at = [], 0
    while at + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, at)
        end = at + FRAME.size + length
        if length < HEAD.size or length > MAX_RECORD or end > len(data) or zlib.crc32(data[at + FRAME.size:end]) != crc:
            break
        ends.append(end)
        at = end
    return ends, len(data) - at
