"""Hypothesis strategies built from the pydantic models themselves, constraints included."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal, Union

import time

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel

from schemas.columns import INTEGER_TYPES, column_for, inner_type
from schemas.events import NcclStep
from schemas.validate import INT_RANGES

# Values the wire and ClickHouse both carry exactly: finite floats in a sane range, printable text, ms timestamps.
_FLOAT = dict(allow_nan=False, allow_infinity=False, width=64)
_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs",)), max_size=24)
# Within a day of now: rows older than a table's TTL vanish at insert time.
_NOW_MS = int(time.time() * 1000)
_EPOCH = st.integers(min_value=_NOW_MS - 86_400_000, max_value=_NOW_MS + 86_400_000).map(lambda ms: ms / 1000)


def _bounds(metadata: list) -> dict:
    out: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, at.Ge):
            out["min_value"] = m.ge
        elif isinstance(m, at.Gt):
            out["min_value"], out["exclude_min"] = m.gt, True
        elif isinstance(m, at.Le):
            out["max_value"] = m.le
        elif isinstance(m, at.Lt):
            out["max_value"], out["exclude_max"] = m.lt, True
        elif isinstance(m, at.MinLen):
            out["min_size"] = m.min_length
    return out


def _for(annotation: Any, metadata: list, name: str) -> st.SearchStrategy:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return st.none() | _for(args[0], metadata, name)
    bounds = _bounds(metadata)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        lo = bounds.get("min_value", -(2**40))
        lo = lo + 1 if bounds.get("exclude_min") else lo
        return st.integers(min_value=lo, max_value=bounds.get("max_value", 2**40))
    if annotation is float:
        if name in {"ts", "first_ts", "last_ts", "since", "starts_at", "ends_at", "window_start", "window_end", "end_ts",
                    "minute_ts"}:
            return _EPOCH
        lo = bounds.get("min_value", -1e6)
        return st.floats(min_value=lo, max_value=bounds.get("max_value", 1e6),
                         exclude_min=bounds.get("exclude_min", False), **_FLOAT)
    if annotation is str:
        return _TEXT.filter(lambda s: len(s) >= bounds.get("min_size", 0))
    if origin is Literal:
        return st.sampled_from(typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from([e.value for e in annotation])
    if origin is list:
        (item,) = typing.get_args(annotation)
        return st.lists(_for(item, [], name), max_size=4)
    if origin is dict:
        _, value = typing.get_args(annotation)
        return st.dictionaries(_TEXT, _for(value, [], name), max_size=3)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_dicts(annotation)
    raise NotImplementedError(f"no strategy for {annotation!r}")


def _world_holds_its_ranks(d: dict) -> dict:
    """NcclStep: a world size drawn below one of the step's ranks is raised to hold them (the rest filter)."""
    return {**d, "world_size": min(max(d["world_size"], *(r["rank"] + 1 for r in d["ranks"])), 2**32 - 1)}


REPAIRS = {NcclStep: _world_holds_its_ranks}  # cross-field rules met by construction where a filter would reject most


def _stored(name: str, info) -> st.SearchStrategy | None:
    """A number field kept in an integer column (gpu_samples' °C, %, MHz, mW): values at the stored resolution, within
    the model's bounds and the column's range, as a source that reports that resolution sends them."""
    column = column_for(name, info)
    inner = inner_type(column.type)
    if inner not in INTEGER_TYPES or float not in (info.annotation, *typing.get_args(info.annotation)):
        return None
    lo, hi = INT_RANGES[inner]
    bounds = _bounds(info.metadata)
    lo = max(lo, round(bounds.get("min_value", lo / column.scale) * column.scale))
    hi = min(hi, round(bounds.get("max_value", hi / column.scale) * column.scale))
    values = st.integers(min_value=lo, max_value=hi).map(lambda k: k / column.scale)
    return st.none() | values if type(None) in typing.get_args(info.annotation) else values


def model_dicts(model: type[BaseModel]) -> st.SearchStrategy[dict]:
    """Plain dicts that the model accepts, its cross-field rules (`lean_checks`) included; a list of nested models
    (`gpus`, `ranks`) gets 1-8 of them."""
    fields = {}
    for name, info in model.model_fields.items():
        args = typing.get_args(info.annotation)
        if typing.get_origin(info.annotation) is list and args and isinstance(args[0], type) \
                and issubclass(args[0], BaseModel):
            fields[name] = st.lists(model_dicts(args[0]), min_size=1, max_size=8)
        else:
            stored = _stored(name, info)
            fields[name] = stored if stored is not None else _for(info.annotation, info.metadata, name)
    checks = getattr(model, "lean_checks", ())
    drawn = st.fixed_dictionaries(fields)
    if model in REPAIRS:
        drawn = drawn.map(REPAIRS[model])
    return drawn.filter(lambda d: all(check(d) is None for check in checks))
