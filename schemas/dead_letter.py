"""Dead-letter record format: the original bytes plus why, where from, and which component refused it."""

from __future__ import annotations

import base64
import time

import orjson


def dead_letter(
    value: bytes | None, *, reason: str, topic: str, partition: int, offset: int, component: str
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """(value, headers) for `<topic>.dlq`: a JSON envelope, with the routing facts also as headers."""
    envelope = {
        "reason": reason,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "component": component,
        "ts": time.time(),
        "value_b64": base64.b64encode(value).decode() if value is not None else None,
    }
    headers = [
        ("reason", reason.encode()[:1000]),
        ("source_topic", topic.encode()),
        ("partition", str(partition).encode()),
        ("offset", str(offset).encode()),
        ("component", component.encode()),
    ]
    return orjson.dumps(envelope), headers


def original(envelope: bytes) -> tuple[dict, bytes | None]:
    """Decode an envelope back into (facts, original value bytes) for replay tooling."""
    facts = orjson.loads(envelope)
    raw = facts.pop("value_b64")
    return facts, base64.b64decode(raw) if raw is not None else None
