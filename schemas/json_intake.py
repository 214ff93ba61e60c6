"""A table's rows computed by ClickHouse from its topic's raw JSON records, instead of by Python (Table.rows).

The sink still decodes and checks every record with the topic's validator (schemas/validate.py): what is refused is
dead-lettered exactly as the stream worker refuses it. A record that passes is not turned into Python rows: its own
bytes, with its Kafka partition, offset and timestamp spliced in front of its fields (`line`), go to the engine as
one JSONEachRow line, and one `INSERT INTO <table> (columns) SELECT <expressions> FROM <the lines>` stores every row
of the batch under the batch's deduplication token. The expressions compute each stored column the way Table.rows
converts its field (a number kept at a resolution is rounded half to even, as Python's round() does, then scaled;
epoch seconds become whole milliseconds; a record's list is ARRAY JOINed into one row per element), so both ways store
the same values (tests/schemas/test_json_intake.py draws records and compares them column by column).

Where the lines come from: on a ClickHouse server the request's body (`input()`); on the embedded engine a file the
sink writes and removes (`file()`), as clickhouse-connect does for chdb's own inserts (a query parameter of that size
was measured 12x slower to parse).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from schemas.columns import INTEGER_TYPES, _default_type, inner_type
from schemas.tables import KAFKA_LAG, TABLES, Table, _Field

PARTITION, OFFSET, KAFKA_TS = "_fleetpulse_partition", "_fleetpulse_offset", "_fleetpulse_kafka_ts"

# Explicit, whatever the server's defaults: unknown keys skipped (a newer producer), a missing key takes its default,
# a JSON object read as a named tuple, floats parsed exactly as Python reads them (with the engine's fast float
# parser, the drawn records of tests/schemas/test_json_intake.py store other values than Python's).
SETTINGS = {
    "input_format_skip_unknown_fields": 1,
    "input_format_defaults_for_omitted_fields": 1,
    "input_format_null_as_default": 1,
    "input_format_json_named_tuples_as_objects": 1,
    "input_format_json_defaults_for_missing_elements_in_named_tuple": 1,
    "input_format_json_ignore_unknown_keys_in_named_tuple": 1,
    "precise_float_parsing": 1,
}


def _input_type(annotation: Any) -> str:
    """How the engine reads a field's JSON value: as the wire carries it (a float stays Float64 until rounded)."""
    args = typing.get_args(annotation)
    if type(None) in args:
        inner = _input_type(next(a for a in args if a is not type(None)))
        return inner if inner.startswith(("Array(", "Map(")) else f"Nullable({inner})"
    origin = typing.get_origin(annotation)
    if origin is Literal:
        kinds = {type(a) for a in args}
        return "Int64" if kinds == {int} else "String"
    kind = _default_type(annotation)  # the column type a field of that annotation gets, read as the wire has it
    if kind != "JSON-as-String":
        return kind
    raise ValueError(f"no JSON intake for a field of type {annotation!r}")


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, list) and not value:
        return "[]"
    raise ValueError(f"no SQL literal for the default {value!r}")


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _defaulted(field: _Field) -> bool:
    """A field a record may leave out and that then takes a value (`source` is "nvml"): read as Nullable, a missing
    key is NULL, and the SELECT puts the default in. The engine's own DEFAULT in the structure is not relied on: a
    server applies none to the rows of `input()`. The validator refuses an explicit null for such a field."""
    return not field.required and field.default is not None and not isinstance(field.default, list)


def _read_type(field: _Field, annotation: Any) -> str:
    kind = _input_type(annotation)
    if _defaulted(field) and kind.startswith("Nullable("):
        raise ValueError(f"{field.key}: a field that may be null and has a default of its own is not read by the "
                         "engine")
    return f"Nullable({kind})" if _defaulted(field) else kind


def _expression(field: _Field, annotation: Any, ref: str) -> str:
    """The stored column's value from the field's input value, converted as the field's Column.convert does."""
    if _defaulted(field):
        ref = f"coalesce({ref}, {_literal(field.default)})"
    col = field.column
    inner = inner_type(col.type)
    reads_float = "Float64" in _input_type(annotation)
    if reads_float and inner.startswith("DateTime64"):
        return f"CAST(fromUnixTimestamp64Milli(toInt64(round({ref} * 1000)), 'UTC') AS {col.type})"
    if reads_float and inner in INTEGER_TYPES:
        scaled = f"{ref} * {col.scale}" if col.scale != 1 else ref
        return f"CAST(round({scaled}) AS {col.type})"
    return f"CAST({ref} AS {col.type})"


@dataclass(frozen=True)
class JsonIntake:
    """The engine-side extraction of one table: the input structure, the SELECT, and how a record becomes a line."""

    table: Table

    def __post_init__(self):
        tb = self.table
        if tb.topic.legacy is not None or not tb.items or not tb.item_fields:
            raise ValueError(f"{tb.name}: JSON intake covers a record with a list of elements and no legacy form")
        self.structure()  # every field readable by the engine, or an error at import

    @cached_property
    def _annotations(self) -> tuple[dict[str, Any], dict[str, Any]]:
        model = self.table.topic.model
        item = typing.get_args(model.model_fields[self.table.items].annotation)[0]
        return ({n: i.annotation for n, i in model.model_fields.items()},
                {n: i.annotation for n, i in item.model_fields.items()})

    def structure(self, provenance: bool = True) -> str:
        """The lines' columns: the record's fields, its list as named tuples, the provenance (spliced in by `line`)."""
        head, item = self._annotations
        cols = []
        for f in self.table.fields:
            cols.append(f"`{f.key}` {_read_type(f, head[f.key])}")
        elements = ", ".join(f"`{f.key}` {_read_type(f, item[f.key])}" for f in self.table.item_fields)
        cols.append(f"`{self.table.items}` Array(Tuple({elements}))")
        if provenance:
            cols += [f"`{PARTITION}` UInt16", f"`{OFFSET}` UInt64", f"`{KAFKA_TS}` Int64"]
        return ", ".join(cols)

    def select(self, partition: str = f"`{PARTITION}`", offset: str = f"`{OFFSET}`",
               kafka_ts_ms: str = f"`{KAFKA_TS}`") -> str:
        """Every stored column, in the table's column order, computed from one line and one element of its list; the
        provenance from the spliced fields, or the expressions given (a Kafka table's virtual columns)."""
        tb = self.table
        head, item = self._annotations
        exprs = [_expression(f, head[f.key], f"`{f.key}`") for f in tb.fields]
        if tb.count_column:
            exprs.append(f"CAST(length(`{tb.items}`) AS UInt8)")
        exprs += [_expression(f, item[f.key], f"_item.`{f.key}`") for f in tb.item_fields]
        exprs += [partition, offset]
        if tb.provenance[-1] is KAFKA_LAG:  # the publish delay: the Kafka timestamp less the record's own time, in ms
            exprs.append(f"{kafka_ts_ms} - toUnixTimestamp64Milli(`{tb.time_column}`)")  # the stored time, by alias
        else:
            exprs.append(f"fromUnixTimestamp64Milli({kafka_ts_ms}, 'UTC')")
        return ", ".join(f"{e} AS `{c}`" for e, c in zip(exprs, tb.column_names))

    @property
    def columns(self) -> str:
        """The table's columns, in order, as an INSERT or a view names them."""
        return ", ".join(f"`{c}`" for c in self.table.column_names)

    def query(self, source: str, **provenance: str) -> str:
        """The SELECT of every stored row from `source` (lines of `structure()`, or a table of that shape): one row
        per element of each line's list. `provenance` as `select` takes it."""
        return f"SELECT {self.select(**provenance)} FROM {source} ARRAY JOIN `{self.table.items}` AS _item"

    def statement(self, table: str, path: str | None = None) -> str:
        """The insert into `table` (its name on this store) of the lines in the request's body, or in the file `path`
        (the embedded engine)."""
        structure = _quote(self.structure())
        if path is not None:
            source, tail = f"file({_quote(path)}, JSONEachRow, {structure})", ""
        else:
            source, tail = f"input({structure})", " FORMAT JSONEachRow"
        return f"INSERT INTO {table} ({self.columns}) {self.query(source)}{tail}"

    @staticmethod
    def line(raw: bytes, partition: int, offset: int, kafka_ts_ms: int) -> bytes:
        """A checked record's own bytes with its provenance as its first fields (one JSON object per line: a record
        written over several lines is joined; JSON allows a raw newline only as whitespace between tokens)."""
        body = raw.strip()
        if b"\n" in body or b"\r" in body:
            body = body.replace(b"\r", b" ").replace(b"\n", b" ")
        rest = body[1:]
        comma = b"" if rest.lstrip().startswith(b"}") else b","
        return b'{"%s":%d,"%s":%d,"%s":%d%s%s' % (PARTITION.encode(), partition, OFFSET.encode(), offset,
                                                   KAFKA_TS.encode(), kafka_ts_ms, comma, rest)


INTAKES: dict[str, JsonIntake] = {name: JsonIntake(TABLES[name]) for name in ("gpu_samples",)}
