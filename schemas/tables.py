"""ClickHouse tables derived from the topic models, and the lean record -> rows extraction the sink uses."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from pydantic import BaseModel

from core.errors import DecodeError
from schemas import topics as t
from schemas.columns import Alias, Column, column_for
from schemas.events import NcclTiming
from schemas.network import NetSample, PortReading
from schemas.telemetry import GpuReading, HostSample

PROVENANCE = (
    Column("kafka_partition", "UInt16", None, int),
    Column("kafka_offset", "UInt64", "Delta, ZSTD(1)", int),
    # The record's Kafka timestamp (producer create time, ms): end-to-end latencies are measured from it.
    Column("kafka_ts", "DateTime64(3, 'UTC')", "Delta, ZSTD(1)", int),
)
# When the sink stored the row: not inserted, the server's clock (DEFAULT).
INGESTED_AT = Column("ingested_at", "DateTime64(3, 'UTC')", "Delta, ZSTD(1)", int)
# gpu_samples stores a record's provenance once per GPU, sorted by GPU and time, where it is most of what the table
# holds besides the counters: a host's offsets grow by a near-constant step (DoubleDelta), the Kafka timestamp is kept
# as its distance from the sample's time (the publish delay, a few ms; `kafka_ts` reads it back), and the time the row
# was stored is kept to the second (docs/storage.md).
KAFKA_LAG = Column("kafka_lag_ms", "Int64", "T64, ZSTD(1)", int, alias=Alias(
    "kafka_ts", "DateTime64(3, 'UTC')", "ts + toIntervalMillisecond(kafka_lag_ms)",
    "toUnixTimestamp64Milli(kafka_ts) - toUnixTimestamp64Milli(ts)"))
PER_GPU_PROVENANCE = (PROVENANCE[0], Column("kafka_offset", "UInt64", "DoubleDelta, ZSTD(1)", int), KAFKA_LAG)
INGESTED_AT_S = Column("ingested_at", "DateTime('UTC')", "Delta, ZSTD(1)", int)
_MISSING = object()


@dataclass(frozen=True)
class _Field:
    """How one JSON key becomes one column value."""

    key: str
    column: Column
    required: bool
    default: Any

    def take(self, record: dict) -> Any:
        value = record.get(self.key, _MISSING)
        if value is _MISSING:
            if self.required:
                raise DecodeError(f"missing field {self.key!r}")
            value = self.default
        try:
            return self.column.convert(value)
        except DecodeError as exc:
            raise DecodeError(f"field {self.key!r}: {exc}") from None


def _fields(model: type[BaseModel], rename: dict[str, str] | None = None, exclude=frozenset()) -> list[_Field]:
    rename = rename or {}
    out = []
    for name, info in model.model_fields.items():
        if name in exclude:
            continue
        col = column_for(name, info)
        if name in rename:
            col = replace(col, name=rename[name])
        out.append(_Field(name, col, info.is_required(), None if info.is_required() else info.get_default(call_default_factory=True)))
    return out


@dataclass(frozen=True)
class Table:
    """One sink table: its columns, sort key, partitioning and retention, and the topic it is fed from.

    A table with `items` stores one row per element of that list field of a record (a sample's GPUs, a step's ranks):
    the record's other fields, optionally the list's length (`count_column`), then the element's fields; with
    `item_fields` empty, `fields` are taken from the record and the element together (the element's keys win), so
    the columns keep the order of a per-element model (nccl_timings: NcclTiming's, as before NcclStep)."""

    name: str
    topic: t.Topic
    fields: list[_Field]
    order_by: tuple[str, ...]
    tier: str  # its retention tier: "telemetry", "scores" or "events" (schemas/ddl.py RETENTION_DAYS)
    time_column: str = "ts"
    items: str | None = None
    item_fields: list[_Field] = field(default_factory=list)
    count_column: str | None = None
    provenance: tuple[Column, ...] = PROVENANCE
    ingested_at: Column = INGESTED_AT
    shard_by: str = "host"  # on a cluster, the column whose hash picks a row's shard (schemas/layout.py)

    @property
    def columns(self) -> list[Column]:
        data = [f.column for f in self.fields]
        if self.items:
            data += [Column(self.count_column, "UInt8", None, int)] if self.count_column else []
            data += [f.column for f in self.item_fields]
        return data + list(self.provenance)

    @property
    def aliases(self) -> list[Column]:
        """The columns stored in another form than their field's (scaled, or a lag), each also readable under the
        field's own name as an ALIAS column."""
        return [c for c in self.columns if c.alias]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def rows(self, record: Any, partition: int, offset: int, kafka_ts_ms: int = 0) -> list[tuple]:
        """Rows for one decoded record; raises DecodeError (-> dead-letter topic) on a malformed one."""
        if type(record) is not dict:
            raise DecodeError(f"expected a JSON object, got {type(record).__name__}")
        if not self.items:
            row = tuple(f.take(record) for f in self.fields)
            return [row + self._provenance(row, partition, offset, kafka_ts_ms)]
        items = record.get(self.items)
        if not self.item_fields:
            if type(items) is not list or any(type(item) is not dict for item in items):
                raise DecodeError(f"field {self.items!r}: expected a list of objects")
            return [tuple(f.take({**record, **item}) for f in self.fields) + (partition, offset, kafka_ts_ms)
                    for item in items]
        head = tuple(f.take(record) for f in self.fields)  # a missing shared field is named first
        if type(items) is not list:
            raise DecodeError(f"field {self.items!r}: expected a list")
        tail = self._provenance(head, partition, offset, kafka_ts_ms)
        if self.count_column:
            head += (len(items),)
        rows = []  # a host whose every GPU faulted sends none: nothing to store, its faults are on fleet.faults
        for item in items:
            if type(item) is not dict:
                raise DecodeError(f"field {self.items!r}: expected objects")
            rows.append(head + tuple(f.take(item) for f in self.item_fields) + tail)
        return rows

    @cached_property
    def _lag_at(self) -> int | None:
        """Where the record's time is in a row's head, when the Kafka timestamp is stored as its distance from it."""
        if self.provenance[-1] is not KAFKA_LAG:
            return None
        return [f.column.name for f in self.fields].index(self.time_column)

    def _provenance(self, head: tuple, partition: int, offset: int, kafka_ts_ms: int) -> tuple:
        lag_at = self._lag_at
        return (partition, offset, kafka_ts_ms if lag_at is None else kafka_ts_ms - head[lag_at])


def _flat(name: str, topic: t.Topic, order_by: tuple[str, ...], tier: str, shard_by: str = "host") -> Table:
    return Table(name, topic, _fields(topic.model), order_by, tier, shard_by=shard_by)


GPU_RENAME = {"index": "gpu_index", "uuid": "gpu_uuid", "model": "gpu_model"}

TABLES: dict[str, Table] = {
    tb.name: tb
    for tb in [
        Table(
            "gpu_samples", t.SAMPLES, _fields(HostSample, exclude={"gpus"}),
            order_by=("cluster", "host", "gpu_index", "ts"), tier="telemetry",
            items="gpus", item_fields=_fields(GpuReading, rename=GPU_RENAME), count_column="gpu_count",
            provenance=PER_GPU_PROVENANCE, ingested_at=INGESTED_AT_S,
        ),
        _flat("xid_events", t.XID, ("host", "ts", "code"), "events"),
        Table("nccl_timings", t.NCCL, _fields(NcclTiming), ("job", "seq", "rank"), "telemetry", items="ranks",
              shard_by="job"),  # a job's ranks on one shard: its straggler windows are whole there
        _flat("agent_status", t.AGENT, ("host", "ts"), "events"),
        Table("net_ports", t.NET, _fields(NetSample, exclude={"ports"}), order_by=("cluster", "host", "device", "port",
              "ts"), tier="telemetry", items="ports", item_fields=_fields(PortReading), count_column="port_count"),
        _flat("host_events", t.HOST_EVENTS, ("host", "ts", "code"), "events"),
        _flat("health_scores", t.HEALTH, ("host", "ts"), "scores"),
        _flat("faults", t.FAULTS, ("host", "ts", "code"), "events"),
        _flat("stragglers", t.STRAGGLERS, ("job", "ts", "rank"), "scores", shard_by="job"),
        _flat("alerts", t.ALERTS, ("alertname", "fingerprint", "ts"), "events", shard_by="fingerprint"),
        _flat("node_states", t.NODE_STATE, ("host", "ts"), "events"),
        _flat("drain_events", t.DRAIN, ("host", "ts"), "events"),
        _flat("remediation_results", t.REMEDIATION, ("host", "ts"), "events"),
        Table("usable_compute", t.USABLE, _fields(t.USABLE.model), ("scope", "minute_ts"), "events",
              time_column="minute_ts", shard_by="scope"),
        _flat("sim_truth", t.TRUTH, ("run_id", "ts", "host"), "events"),
    ]
}
TABLE_BY_TOPIC: dict[str, Table] = {tb.topic.name: tb for tb in TABLES.values()}
