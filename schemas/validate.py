"""One lean validator per topic, derived from its pydantic model and ClickHouse columns: every consumer refuses the
same records.

The model says what a record is; `lean_type` turns it into a msgspec type with the same fields, the model's bounds and
the bounds of each field's ClickHouse column (a UInt8 holds 0..255, a DateTime64 ends in 2299), so one C pass decodes
and checks a record into plain dicts at about the cost of decoding alone. Strict like the sink's columns: a boolean is
not a number, a string is not a float, a float is not an integer. Fields a record may omit stay absent in nested
objects; top-level defaults are filled in. Unknown keys are dropped, so an older consumer reads a newer producer.
Rules that span fields (a rank below its world size) are the model's `lean_checks`, run after the pass.
"""

from __future__ import annotations

import enum
import functools
import time
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NotRequired, Optional, TypedDict, Union

import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from core.errors import DecodeError
from schemas.columns import column_for, inner_type

LeanCheck = Callable[[Mapping[str, Any]], "str | None"]  # a reason when the record breaks a cross-field rule

# Value ranges of ClickHouse column types: a value outside its column's range fails the insert, so it is refused here.
INT_RANGES = {
    "UInt8": (0, 2**8 - 1), "UInt16": (0, 2**16 - 1), "UInt32": (0, 2**32 - 1),
    "UInt64": (0, 2**63 - 1),  # msgspec's bounds must fit an int64; no counter or offset comes near it
    "Int16": (-(2**15), 2**15 - 1), "Int32": (-(2**31), 2**31 - 1), "Int64": (-(2**63), 2**63 - 1),
}
DATETIME64_END_S = 10_413_792_000  # 2300-01-01: DateTime64's last representable instant is in 2299
_BOUNDS = ("ge", "gt", "le", "lt", "min_length", "max_length")


def _bounds(name: str, info: FieldInfo, base: Any) -> dict[str, Any]:
    """The model's constraints on a field, tightened by what its ClickHouse column can hold."""
    meta = {k: getattr(m, k) for m in info.metadata for k in _BOUNDS if getattr(m, k, None) is not None}
    if base not in (int, float):
        return meta
    column = column_for(name, info)
    inner = inner_type(column.type)
    if inner in INT_RANGES:  # an int, or a number stored as whole 1/scale units (which round to the range's ends)
        lo, hi = INT_RANGES[inner]
        if base is float:
            lo, hi = (lo - 0.25) / column.scale, (hi + 0.25) / column.scale  # well inside what rounds to them
        if "ge" not in meta and "gt" not in meta:
            meta["ge" if base is int else "gt"] = lo
        if "le" not in meta and "lt" not in meta:
            meta["le" if base is int else "lt"] = hi
    elif inner.startswith("DateTime64") and base is float:  # epoch seconds: after 1970, before 2300
        if "ge" not in meta and "gt" not in meta:
            meta["gt"] = 0.0
        if "le" not in meta and "lt" not in meta:
            meta["lt"] = DATETIME64_END_S
    return meta


def _lean(annotation: Any) -> Any:
    """A pydantic annotation as a msgspec one: nested models become TypedDicts, enums the Literal of their values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return lean_type(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return Literal[tuple(m.value for m in annotation)]  # plain strings out, as orjson wrote them
    if origin in (Union, types.UnionType):
        return Union[tuple(_lean(a) for a in args)]
    if origin is list:
        return list[_lean(args[0])] if args else list
    if origin is dict:
        return dict[_lean(args[0]), _lean(args[1])] if args else dict
    return annotation


def _field_type(name: str, info: FieldInfo) -> Any:
    annotation = info.annotation
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    base = _lean(next(a for a in args if a is not type(None)) if optional and len(args) == 2 else annotation)
    meta = _bounds(name, info, base)
    if meta:
        base = Annotated[base, msgspec.Meta(**meta)]
    return Optional[base] if optional else base


@functools.cache
def lean_type(model: type[BaseModel]) -> type:
    """The msgspec TypedDict for `model`: required fields required, the rest may be absent."""
    fields = {name: _field_type(name, info) if info.is_required() else NotRequired[_field_type(name, info)]
              for name, info in model.model_fields.items()}
    return TypedDict(model.__name__, fields)  # type: ignore[operator]


@functools.cache
def max_future_s() -> float:
    """How far ahead of this process's clock a record's time may be (FLEETPULSE_MAX_FUTURE_S)."""
    from core.settings import CommonSettings, load

    return load(CommonSettings).max_future_s


@functools.cache
def max_record_bytes() -> int:
    """The largest record value a consumer decodes (FLEETPULSE_MAX_RECORD_BYTES)."""
    from core.settings import CommonSettings, load

    return load(CommonSettings).max_record_bytes


def _stamps(model: type[BaseModel]) -> tuple[str | None, str | None]:
    """The record's own time field, and the list whose items carry theirs (NcclStep's ranks)."""
    nested = None
    for name, info in model.model_fields.items():
        item = typing.get_args(info.annotation)[0] if typing.get_origin(info.annotation) is list else None
        if isinstance(item, type) and issubclass(item, BaseModel) and "ts" in item.model_fields:
            nested = name
            break
    return ("ts" if "ts" in model.model_fields else None), nested


class Validator:
    """Decode and check records of one model: `decode(raw bytes)` for consumers, `check(dict)` for in-memory values.

    Consumers also refuse a record stamped more than max_future_s() ahead of their clock: one sample from a host whose
    clock says 2031 would move that host's watermark there, and every true sample after it would look stale; and a
    record larger than max_record_bytes(), before decoding it."""

    def __init__(self, model: type[BaseModel]):
        self.model = model
        self.type = lean_type(model)
        self._decoder = msgspec.json.Decoder(self.type)
        self._defaults = [(name, functools.partial(info.get_default, call_default_factory=True))
                          for name, info in model.model_fields.items() if not info.is_required()]
        self._checks: tuple[LeanCheck, ...] = getattr(model, "lean_checks", ())
        self._fields = len(model.model_fields)
        self._ts, self._nested_ts = _stamps(model)

    def decode(self, raw: bytes | None) -> dict:
        """Bytes -> the checked record as plain dicts; DecodeError names the first field at fault."""
        if raw is None:
            raise DecodeError("empty record value (tombstone)")
        if len(raw) > max_record_bytes():  # refused unread: what a consumer holds for one record stays bounded
            raise DecodeError(f"record of {len(raw):,} bytes is over FLEETPULSE_MAX_RECORD_BYTES="
                              f"{max_record_bytes():,}")
        try:
            value = self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"invalid {self.model.__name__}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"not JSON: {exc}") from None
        except RecursionError:  # nesting deeper than the interpreter's stack (msgspec recurses while it skips)
            raise DecodeError("not a record: JSON nested too deep") from None
        return self._finish(value)

    def check(self, value: Any) -> dict:
        """The same rules over an already decoded value (tests, tools): a checked copy, or DecodeError."""
        try:
            checked = msgspec.convert(value, self.type, strict=True)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"invalid {self.model.__name__}: {exc}") from None
        except RecursionError:
            raise DecodeError("not a record: nested too deep") from None
        return self._finish(checked)

    def _finish(self, value: dict) -> dict:
        if self._ts is not None or self._nested_ts is not None:
            self._not_ahead(value)
        if len(value) < self._fields:  # a record that carries every field (most do) has no default to fill
            for name, default in self._defaults:
                if name not in value:
                    value[name] = default()
        for check in self._checks:  # after the defaults: a cross-field rule may read a field the record left out
            reason = check(value)
            if reason is not None:
                raise DecodeError(f"invalid {self.model.__name__}: {reason}")
        return value

    def _not_ahead(self, value: dict) -> None:
        deadline = time.time() + max_future_s()
        ts = value.get(self._ts) if self._ts is not None else None
        if ts is not None and ts > deadline:
            self._ahead(ts, deadline)
        if self._nested_ts is not None:
            for item in value.get(self._nested_ts) or ():
                ts = item.get("ts")
                if ts is not None and ts > deadline:
                    self._ahead(ts, deadline)

    def _ahead(self, ts: float, deadline: float) -> None:
        limit = max_future_s()
        now = deadline - limit
        raise DecodeError(f"invalid {self.model.__name__}: ts {ts!r} is {(ts - now) / 3600:.1f} h ahead of "
                          f"this consumer's clock (FLEETPULSE_MAX_FUTURE_S={limit:g})")


@functools.cache
def validator(model: type[BaseModel]) -> Validator:
    """The one validator of a model (and so of every topic that carries it)."""
    return Validator(model)
