"""Wire encoding: compact JSON through orjson; pydantic validates at the edges, the hot path decodes lean."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from core.errors import DecodeError


def encode(value: BaseModel | dict) -> bytes:
    """Encode a model (None fields kept, so 'unreadable' stays distinguishable from absent) or a plain dict."""
    if isinstance(value, BaseModel):
        return orjson.dumps(value.model_dump(mode="json"))
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def decode(raw: bytes | None) -> Any:
    """Bytes -> Python objects; a record that is not JSON raises DecodeError (-> dead-letter topic)."""
    if raw is None:
        raise DecodeError("empty record value (tombstone)")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from None


def validate(model: type[BaseModel], raw: bytes) -> BaseModel:
    """Strict validation for the edges (collectors, tests, DLQ tooling)."""
    try:
        return model.model_validate_json(raw)
    except ValueError as exc:
        raise DecodeError(f"invalid {model.__name__}: {exc}") from None
