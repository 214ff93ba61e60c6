"""ClickHouse DDL generated from the table specs, and the check that live tables still match it."""

from __future__ import annotations

import re

from schemas.columns import Column
from schemas.tables import TABLES, Table

WATERMARKS = "sink_watermarks"
RESETS = "sink_topic_resets"
# Insert deduplication must be explicit: non-replicated MergeTree only deduplicates with a window > 0.
TABLE_SETTINGS = "non_replicated_deduplication_window = 10000, index_granularity = 8192"


def ingested_ddl(column: Column) -> str:
    """The column the server fills with the time it stored the row (never inserted)."""
    now = "now64(3)" if column.type.startswith("DateTime64") else "now()"
    return f"`{column.name}` {column.type} DEFAULT {now} CODEC({column.codec})"


def create_table(table: Table, database: str = "default", on_cluster: str | None = None) -> str:
    cluster = f" ON CLUSTER {on_cluster}" if on_cluster else ""
    cols = [c.ddl() for c in table.columns] + [ingested_ddl(table.ingested_at)] + [c.alias.ddl() for c in table.aliases]
    cols = ",\n    ".join(cols)
    tc = table.time_column
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{table.name}{cluster}\n(\n    {cols}\n)\n"
        f"ENGINE = MergeTree\nPARTITION BY toYYYYMMDD({tc})\nORDER BY ({', '.join(table.order_by)})\n"
        f"TTL toDateTime({tc}) + INTERVAL {table.ttl_days} DAY\nSETTINGS {TABLE_SETTINGS}"
    )


def create_watermarks(database: str = "default") -> str:
    """Highest Kafka offset stored per (topic, partition): the sink resumes after it, so replays add nothing."""
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{WATERMARKS}\n(\n"
        "    `topic` LowCardinality(String),\n    `partition` UInt16,\n"
        "    `offset` SimpleAggregateFunction(max, UInt64)\n)\n"
        "ENGINE = AggregatingMergeTree\nORDER BY (topic, partition)"
    )


def create_resets(database: str = "default") -> str:
    """Partitions the sink found recreated (their log ends at or below the store's watermark): their watermark was
    dropped and their records read as new. Also the epoch of a topic's insert deduplication tokens (sinks/batch.py)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{RESETS}\n(\n"
        "    `at` DateTime64(3, 'UTC'),\n    `topic` LowCardinality(String),\n    `partition` UInt16,\n"
        "    `stored_before` UInt64,\n    `log_end` UInt64\n)\n"
        "ENGINE = MergeTree\nORDER BY (topic, partition, at)"
    )


def create_watermark_view(table: Table, database: str = "default", topic_prefix: str = "") -> str:
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{table.name}_watermark_mv TO {database}.{WATERMARKS}\n"
        f"AS SELECT '{table.topic.full(topic_prefix)}' AS topic, kafka_partition AS partition, max(kafka_offset) AS offset\n"
        f"FROM {database}.{table.name} GROUP BY kafka_partition"
    )


def statements(database: str = "default", topic_prefix: str = "") -> list[str]:
    """Every statement needed for a fresh database, in order."""
    out = [f"CREATE DATABASE IF NOT EXISTS {database}", create_watermarks(database), create_resets(database)]
    for table in TABLES.values():
        out += [create_table(table, database), create_watermark_view(table, database, topic_prefix)]
    return out


def expected_columns(table: Table) -> list[tuple[str, str, str]]:
    """(name, type, codec) as system.columns reports them."""
    cols = [(c.name, c.type, f"CODEC({c.codec})" if c.codec else "") for c in table.columns]
    cols.append((table.ingested_at.name, table.ingested_at.type, f"CODEC({table.ingested_at.codec})"))
    return cols + [(c.alias.name, c.alias.type, "") for c in table.aliases]


def normalise_codec(codec: str) -> str:
    """system.columns spells Delta as Delta(8), DoubleDelta as DoubleDelta(2) and Gorilla as Gorilla(8), the
    width of the column's type; compare without widths."""
    return re.sub(r"\b(Delta|DoubleDelta|Gorilla)\(\d\)", r"\1", codec)
