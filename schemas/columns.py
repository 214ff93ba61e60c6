"""Field -> ClickHouse column mapping, and the lean per-value checks the sink applies on the hot path."""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

import orjson
from pydantic.fields import FieldInfo

from core.errors import DecodeError

CH_KEY = "x-clickhouse-type"
CODEC_KEY = "x-clickhouse-codec"
SCALE_KEY = "x-clickhouse-scale"
STORED_KEY = "x-clickhouse-stored-as"


def ch(type_: str, codec: str | None = None, *, scale: int = 1, stored_as: str | None = None) -> dict:
    """Field metadata that pins the ClickHouse type (used where the default mapping is not the best one), and
    optionally its codec. A number field pinned to an integer type is stored at its source's resolution: whole units
    with scale 1 (NVML's integer °C, %, MHz), or `round(value * scale)` in a column named `stored_as` (NVML's
    milliwatts), beside which an ALIAS column under the field's own name gives the value back in the field's unit."""
    meta = {CH_KEY: type_}
    if codec:
        meta[CODEC_KEY] = codec
    if scale != 1:
        if not stored_as:
            raise ValueError("a scaled column needs the name it is stored under")
        meta[SCALE_KEY], meta[STORED_KEY] = scale, stored_as
    return meta


@dataclass(frozen=True)
class Alias:
    """A column computed when read, never inserted, under the name the record's field has: what analysts query where
    the stored column holds the value in another form (`read` gives it back; `stored_from` computes the stored form
    from a table that kept the field itself, for `fleetpulse migrate`)."""

    name: str
    type: str
    read: str
    stored_from: str

    def ddl(self) -> str:
        return f"`{self.name}` {self.type} ALIAS {self.read}"


@dataclass(frozen=True)
class Column:
    """One ClickHouse column and how a decoded JSON value becomes its insert value. A scaled column (`scale` > 1)
    stores round(value * scale) as an integer, with an `alias` under the field's own name that reads it back in the
    field's unit (the same float the record carried, at the stored resolution)."""

    name: str
    type: str
    codec: str | None
    convert: Callable[[Any], Any]
    scale: int = 1
    alias: Alias | None = None

    def ddl(self) -> str:
        codec = f" CODEC({self.codec})" if self.codec else ""
        return f"`{self.name}` {self.type}{codec}"

    @property
    def read_as(self) -> str:
        """The name a query reads this column's value by."""
        return self.alias.name if self.alias else self.name


def inner_type(ch_type: str) -> str:
    """The type a column's values have, without LowCardinality( and Nullable( around it."""
    for wrapper in ("LowCardinality(", "Nullable("):
        while ch_type.startswith(wrapper):
            ch_type = ch_type[len(wrapper):-1]
    return ch_type


def _fail(expected: str, value: Any) -> typing.NoReturn:
    raise DecodeError(f"expected {expected}, got {type(value).__name__} {value!r:.60}")


def _int(v):
    if type(v) is int:
        return v
    _fail("integer", v)


def _float(v):
    if type(v) is float or type(v) is int:
        return float(v)
    _fail("number", v)


def _str(v):
    if type(v) is str:
        return v
    _fail("string", v)


def _bool(v):
    if type(v) is bool:
        return v
    _fail("boolean", v)


def _epoch_ms(v):
    if (type(v) is float or type(v) is int) and v > 0:
        return int(round(v * 1000))
    _fail("epoch seconds", v)


def _scaled(scale: int) -> Callable[[Any], int]:
    """A number stored as an integer count of 1/scale units; the validators bound it to the column's range."""
    def whole(v):
        if type(v) is float or type(v) is int:
            return round(v)
        _fail("number", v)

    def scaled(v):
        if type(v) is float or type(v) is int:
            return round(v * scale)
        _fail("number", v)

    return whole if scale == 1 else scaled


def _str_list(v):
    if type(v) is list and all(type(x) is str for x in v):
        return v
    _fail("list of strings", v)


def _str_map(v):
    if type(v) is dict and all(type(x) is str for x in v.values()):
        return v
    _fail("map of strings", v)


def _float_map(v):
    if type(v) is dict and all(type(x) in (int, float) for x in v.values()):
        return {k: float(x) for k, x in v.items()}
    _fail("map of numbers", v)


def _json(v):
    return orjson.dumps(v).decode()


def _nullable(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(v):
        return None if v is None else inner(v)

    return convert


def _empty_if_none(inner: Callable[[Any], Any], empty: Any) -> Callable[[Any], Any]:
    def convert(v):
        return empty if v is None else inner(v)

    return convert


_CONVERT_BY_TYPE: dict[str, Callable[[Any], Any]] = {
    "Int64": _int, "UInt64": _int, "UInt32": _int, "UInt16": _int, "UInt8": _int, "Int32": _int, "Int16": _int,
    "Float64": _float, "Float32": _float,
    "String": _str, "Bool": _bool,
    "DateTime64(3, 'UTC')": _epoch_ms,
    "Array(String)": _str_list, "Array(LowCardinality(String))": _str_list,
    "Map(String, String)": _str_map, "Map(String, Float64)": _float_map,
}
INTEGER_TYPES = frozenset({"Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64"})
_CODEC_BY_TYPE = {"Float64": "Gorilla, ZSTD(1)", "DateTime64(3, 'UTC')": "Delta, ZSTD(1)"}


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(annotation)):
            return args[0], True
    return annotation, False


def _default_type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "Bool"
    if annotation is int:
        return "Int64"
    if annotation is float:
        return "Float64"
    if annotation is str:
        return "String"
    if origin is Literal or (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
        return "LowCardinality(String)"
    if origin is list and typing.get_args(annotation) == (str,):
        return "Array(String)"
    if origin is dict and typing.get_args(annotation) == (str, str):
        return "Map(String, String)"
    if origin is dict and typing.get_args(annotation) == (str, float):
        return "Map(String, Float64)"
    return "JSON-as-String"


def column_for(name: str, info: FieldInfo) -> Column:
    """The ClickHouse column for one pydantic field (explicit x-clickhouse-type wins)."""
    annotation, optional = _strip_optional(info.annotation)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    pinned = extra.get(CH_KEY)
    base = pinned or _default_type(annotation)
    if base == "JSON-as-String":
        return Column(name, "String", "ZSTD(3)", _json)
    inner = inner_type(base)
    codec = extra.get(CODEC_KEY) or _CODEC_BY_TYPE.get(inner)
    scale, stored = extra.get(SCALE_KEY, 1), extra.get(STORED_KEY)
    if annotation is float and inner in INTEGER_TYPES:
        convert = _scaled(scale)  # the source's resolution: NVML's whole degrees, percent, MHz or milliwatts
    else:
        convert = _CONVERT_BY_TYPE[inner]
    if base.startswith(("Array(", "Map(")):
        return Column(name, base, codec, _empty_if_none(convert, [] if base.startswith("Array(") else {}))
    if optional:
        if "Nullable(" not in base:
            base = f"LowCardinality(Nullable({inner}))" if base.startswith("LowCardinality(") else f"Nullable({base})"
        convert = _nullable(convert)
    if scale != 1:
        unit = Alias(name, "Nullable(Float64)" if optional else "Float64", f"`{stored}` / {scale}",
                     f"round(`{name}` * {scale})")
        return Column(stored, base, codec, convert, scale, alias=unit)
    return Column(name, base, codec, convert)
