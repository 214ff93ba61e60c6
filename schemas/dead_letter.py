"""Dead-letter record format: the original bytes plus why, where from, and which component refused it.

A dead letter must always fit where it goes: a topic's dead-letter topic takes what the producer may send (1 MB by
default), and the record it reports on may be larger than that (that may be why it was refused). So the envelope
carries at most `max_bytes` of the original, with its full size and SHA-256 so the rest can be found (the source
topic, partition and offset still point at the whole record while the topic keeps it); keys and reasons are cut too.
"""

from __future__ import annotations

import base64
import hashlib
import time

import orjson

MAX_ORIGINAL_BYTES = 256 * 1024  # base64 in JSON: ~342 KiB, well inside a 1 MB producer request
MAX_KEY_BYTES = 1024
MAX_REASON_CHARS = 4000


def dead_letter(
    value: bytes | None, *, key: bytes | None = None, reason: str, topic: str, partition: int, offset: int,
    component: str, max_bytes: int = MAX_ORIGINAL_BYTES,
) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) for `<topic>.dlq`: a JSON envelope, with the routing facts also as headers."""
    reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + " [cut]"
    kept = value if value is None or len(value) <= max_bytes else value[:max_bytes]
    envelope = {
        "reason": reason,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "component": component,
        "ts": time.time(),
        "value_bytes": len(value) if value is not None else None,
        "value_sha256": hashlib.sha256(value).hexdigest() if value is not None else None,
        "truncated": kept is not value,
        "value_b64": base64.b64encode(kept).decode() if kept is not None else None,
    }
    headers = [
        ("reason", reason.encode()[:1000]),
        ("source_topic", topic.encode()),
        ("partition", str(partition).encode()),
        ("offset", str(offset).encode()),
        ("component", component.encode()),
    ]
    return (key[:MAX_KEY_BYTES] if key is not None else None), orjson.dumps(envelope), headers


def original(envelope: bytes) -> tuple[dict, bytes | None]:
    """Decode an envelope back into (facts, original value bytes) for replay tooling; `facts["truncated"]` says
    whether the bytes are only the first part of the record (older envelopes lack the field: they never are)."""
    facts = orjson.loads(envelope)
    raw = facts.pop("value_b64")
    facts.setdefault("truncated", False)
    return facts, base64.b64decode(raw) if raw is not None else None
