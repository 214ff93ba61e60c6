"""ClickHouse DDL generated from the table specs, and the check that live tables still match it."""

from __future__ import annotations

import re

from schemas.columns import Column
from schemas.layout import Layout
from schemas.outcome_views import create_outcome_views
from schemas.rollup_views import create_views
from schemas.rollups import ROLLUPS
from schemas.tables import TABLES, Table

WATERMARKS = "sink_watermarks"
RESETS = "sink_topic_resets"
RACK_BUDGETS = "rack_budgets"
INFLIGHT = "sink_inflight"
# Days a row is kept, per tier; the settings (FLEETPULSE_RETENTION_*_DAYS) override them.
RETENTION_DAYS = {"telemetry": 30, "scores": 90, "events": 365, "rollup": 730}
ONE_SERVER = Layout()


# A part under this many uncompressed bytes is written compact (one file) rather than wide (a file and a write buffer
# per column stream). ClickHouse's 10 MB makes each of the sink's gpu_samples inserts wide: 72 columns into
# gpu_samples and 94 into each of its rollup views' parts, most of them Nullable (two streams), cost the server
# ~940 MB per 40,000-GPU insert; compact, ~330 MB (bench/insert_memory.py). Parts merged past it are wide.
WIDE_PART_BYTES = 128 << 20


def table_settings(layout: Layout = ONE_SERVER) -> str:
    """Insert deduplication must be explicit: a one-server MergeTree only deduplicates with a window > 0."""
    return f"{layout.dedup_setting()}, index_granularity = 8192, min_bytes_for_wide_part = {WIDE_PART_BYTES}"


def ingested_ddl(column: Column) -> str:
    """The column the server fills with the time it stored the row (never inserted)."""
    now = "now64(3)" if column.type.startswith("DateTime64") else "now()"
    return f"`{column.name}` {column.type} DEFAULT {now} CODEC({column.codec})"


def create_table(table: Table, layout: Layout = ONE_SERVER, retention: dict[str, int] | None = None) -> str:
    cols = [c.ddl() for c in table.columns] + [ingested_ddl(table.ingested_at)] + [c.alias.ddl() for c in table.aliases]
    cols = ",\n    ".join(cols)
    tc = table.time_column
    return (
        f"CREATE TABLE IF NOT EXISTS {layout.local(table.name)}{layout.on}\n(\n    {cols}\n)\n"
        f"ENGINE = {layout.engine('MergeTree', table.name)}\nPARTITION BY toYYYYMMDD({tc})\n"
        f"ORDER BY ({', '.join(table.order_by)})\n"
        f"TTL {ttl_expression(table.time_column, days(table.tier, retention))}\nSETTINGS {table_settings(layout)}"
    )


def _sink_table(layout: Layout, name: str, columns: list[str], engine: str, tail: str, shard_by: tuple[str, ...],
                *args: str) -> list[str]:
    """One of the sink's own tables (and its Distributed table on a cluster)."""
    body = ",\n    ".join(columns)
    return [f"CREATE TABLE IF NOT EXISTS {layout.local(name)}{layout.on}\n(\n    {body}\n)\n"
            f"ENGINE = {layout.engine(engine, name, *args)}\n{tail}"] + layout.distributed(name, *shard_by)


def create_watermarks(layout: Layout = ONE_SERVER) -> list[str]:
    """Highest Kafka offset stored per (topic, partition): the sink resumes after it, so replays add nothing. On a
    cluster each shard keeps the highest it stored; the sink reads the highest of all."""
    return _sink_table(layout, WATERMARKS, ["`topic` LowCardinality(String)", "`partition` UInt16",
                                            "`offset` SimpleAggregateFunction(max, UInt64)"],
                       "AggregatingMergeTree", "ORDER BY (topic, partition)", ("topic", "partition"))


def create_resets(layout: Layout = ONE_SERVER) -> list[str]:
    """Partitions the sink found recreated (their log ends at or below the store's watermark): their watermark was
    dropped and their records read as new. Also the epoch of a topic's insert deduplication tokens (sinks/batch.py)."""
    return _sink_table(layout, RESETS, ["`at` DateTime64(3, 'UTC')", "`topic` LowCardinality(String)",
                                        "`partition` UInt16", "`stored_before` UInt64", "`log_end` UInt64"],
                       "MergeTree", "ORDER BY (topic, partition, at)", ("topic",))


def create_inflight(layout: Layout = ONE_SERVER) -> list[str]:
    """Each batch the sink is about to insert: its topic, deduplication token and offset ranges, written before the
    insert. A sink that stopped mid-insert stores the last one again whole, with the same token (sinks/inflight.py)."""
    return _sink_table(layout, INFLIGHT, ["`at` DateTime64(3, 'UTC')", "`topic` LowCardinality(String)",
                                          "`token` String", "`epoch` UInt32",
                                          "`ranges` Array(Tuple(UInt16, UInt64, UInt64))"],
                       "MergeTree", "ORDER BY (topic, at)\nTTL toDateTime(at) + toIntervalDay(7)", ("topic",))


def create_rack_budgets(layout: Layout = ONE_SERVER) -> list[str]:
    """The rack power inventory as the sink found it in its settings at each start; the rack_1m view reads each
    rack's latest budget."""
    return _sink_table(layout, RACK_BUDGETS, ["`rack` LowCardinality(String)", "`budget_w` Float64",
                                              "`set_at` DateTime64(3, 'UTC')"],
                       "ReplacingMergeTree", "ORDER BY rack", ("rack",), "set_at")


def create_watermark_view(table: Table, layout: Layout = ONE_SERVER, topic_prefix: str = "") -> str:
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {layout.database}.{table.name}_watermark_mv{layout.on} "
        f"TO {layout.local(WATERMARKS)}\n"
        f"AS SELECT '{table.topic.full(topic_prefix)}' AS topic, kafka_partition AS partition, max(kafka_offset) AS offset\n"
        f"FROM {layout.local(table.name)} GROUP BY kafka_partition"
    )


def days(tier: str, retention: dict[str, int] | None) -> int:
    return (retention or {}).get(tier, RETENTION_DAYS[tier])


def ttl_expression(time_column: str, ttl_days: int) -> str:
    return f"toDateTime({time_column}) + toIntervalDay({ttl_days})"


def statements(layout: Layout = ONE_SERVER, topic_prefix: str = "",
               retention: dict[str, int] | None = None) -> list[str]:
    """Every statement needed for a fresh database, in order."""
    return table_statements(layout, topic_prefix, retention) + rollup_statements(layout, retention)


def table_statements(layout: Layout, topic_prefix: str, retention: dict[str, int] | None) -> list[str]:
    """The database, the sink's own tables, and each table with its watermark view."""
    out = [f"CREATE DATABASE IF NOT EXISTS {layout.database}{layout.on}", *create_watermarks(layout),
           *create_resets(layout), *create_inflight(layout), *create_rack_budgets(layout)]
    for table in TABLES.values():
        out += [create_table(table, layout, retention), *layout.distributed(table.name, table.shard_by),
                create_watermark_view(table, layout, topic_prefix)]
    return out


def rollup_statements(layout: Layout, retention: dict[str, int] | None) -> list[str]:
    """Each rollup's table, then the materialized view that feeds it, then the plain views over them and over the
    derived tables (outcomes)."""
    out = []
    for rollup in ROLLUPS.values():
        ttl = ttl_expression(rollup.time_column, days("rollup", retention))
        out += rollup.create(layout, ttl, table_settings(layout))
    return out + create_views(layout) + create_outcome_views(layout)


def expected_columns(table: Table) -> list[tuple[str, str, str]]:
    """(name, type, codec) as system.columns reports them."""
    cols = [(c.name, c.type, f"CODEC({c.codec})" if c.codec else "") for c in table.columns]
    cols.append((table.ingested_at.name, table.ingested_at.type, f"CODEC({table.ingested_at.codec})"))
    return cols + [(c.alias.name, c.alias.type, "") for c in table.aliases]


def normalise_codec(codec: str) -> str:
    """system.columns spells Delta as Delta(8), DoubleDelta as DoubleDelta(2) and Gorilla as Gorilla(8), the
    width of the column's type; compare without widths."""
    return re.sub(r"\b(Delta|DoubleDelta|Gorilla)\(\d\)", r"\1", codec)
