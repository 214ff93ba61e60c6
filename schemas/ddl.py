"""ClickHouse DDL generated from the table specs, and the check that live tables still match it."""

from __future__ import annotations

import re

from schemas.columns import Column
from schemas.outcome_views import create_outcome_views
from schemas.rollup_views import create_views
from schemas.rollups import ROLLUPS
from schemas.tables import TABLES, Table

WATERMARKS = "sink_watermarks"
RESETS = "sink_topic_resets"
RACK_BUDGETS = "rack_budgets"
INFLIGHT = "sink_inflight"
# Insert deduplication must be explicit: non-replicated MergeTree only deduplicates with a window > 0.
TABLE_SETTINGS = "non_replicated_deduplication_window = 10000, index_granularity = 8192"
# Days a row is kept, per tier; the settings (FLEETPULSE_RETENTION_*_DAYS) override them.
RETENTION_DAYS = {"telemetry": 30, "scores": 90, "events": 365, "rollup": 730}


def ingested_ddl(column: Column) -> str:
    """The column the server fills with the time it stored the row (never inserted)."""
    now = "now64(3)" if column.type.startswith("DateTime64") else "now()"
    return f"`{column.name}` {column.type} DEFAULT {now} CODEC({column.codec})"


def create_table(table: Table, database: str = "default", on_cluster: str | None = None,
                 retention: dict[str, int] | None = None) -> str:
    cluster = f" ON CLUSTER {on_cluster}" if on_cluster else ""
    cols = [c.ddl() for c in table.columns] + [ingested_ddl(table.ingested_at)] + [c.alias.ddl() for c in table.aliases]
    cols = ",\n    ".join(cols)
    tc = table.time_column
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{table.name}{cluster}\n(\n    {cols}\n)\n"
        f"ENGINE = MergeTree\nPARTITION BY toYYYYMMDD({tc})\nORDER BY ({', '.join(table.order_by)})\n"
        f"TTL {ttl_expression(table.time_column, days(table.tier, retention))}\nSETTINGS {TABLE_SETTINGS}"
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


def create_inflight(database: str = "default") -> str:
    """Each batch the sink is about to insert: its topic, deduplication token and offset ranges, written before the
    insert. A sink that stopped mid-insert stores the last one again whole, with the same token (sinks/inflight.py)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{INFLIGHT}\n(\n"
        "    `at` DateTime64(3, 'UTC'),\n    `topic` LowCardinality(String),\n    `token` String,\n"
        "    `epoch` UInt32,\n    `ranges` Array(Tuple(UInt16, UInt64, UInt64))\n)\n"
        "ENGINE = MergeTree\nORDER BY (topic, at)\nTTL toDateTime(at) + toIntervalDay(7)"
    )


def create_rack_budgets(database: str = "default") -> str:
    """The rack power inventory as the sink found it in its settings at each start; the rack_1m view reads each
    rack's latest budget."""
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{RACK_BUDGETS}\n(\n"
        "    `rack` LowCardinality(String),\n    `budget_w` Float64,\n    `set_at` DateTime64(3, 'UTC')\n)\n"
        "ENGINE = ReplacingMergeTree(set_at)\nORDER BY rack"
    )


def create_watermark_view(table: Table, database: str = "default", topic_prefix: str = "") -> str:
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{table.name}_watermark_mv TO {database}.{WATERMARKS}\n"
        f"AS SELECT '{table.topic.full(topic_prefix)}' AS topic, kafka_partition AS partition, max(kafka_offset) AS offset\n"
        f"FROM {database}.{table.name} GROUP BY kafka_partition"
    )


def days(tier: str, retention: dict[str, int] | None) -> int:
    return (retention or {}).get(tier, RETENTION_DAYS[tier])


def ttl_expression(time_column: str, ttl_days: int) -> str:
    return f"toDateTime({time_column}) + toIntervalDay({ttl_days})"


def statements(database: str = "default", topic_prefix: str = "", retention: dict[str, int] | None = None) -> list[str]:
    """Every statement needed for a fresh database, in order."""
    return table_statements(database, topic_prefix, retention) + rollup_statements(database, retention)


def table_statements(database: str, topic_prefix: str, retention: dict[str, int] | None) -> list[str]:
    """The database, the sink's own tables, and each table with its watermark view."""
    out = [f"CREATE DATABASE IF NOT EXISTS {database}", create_watermarks(database), create_resets(database),
           create_inflight(database), create_rack_budgets(database)]
    for table in TABLES.values():
        out += [create_table(table, database, retention=retention),
                create_watermark_view(table, database, topic_prefix)]
    return out


def rollup_statements(database: str, retention: dict[str, int] | None) -> list[str]:
    """Each rollup's table, then the materialized view that feeds it, then the plain views over them and over the
    derived tables (outcomes)."""
    out = []
    for rollup in ROLLUPS.values():
        ttl = ttl_expression(rollup.time_column, days("rollup", retention))
        out += rollup.create(database, ttl, TABLE_SETTINGS)
    return out + create_views(database) + create_outcome_views(database)


def expected_columns(table: Table) -> list[tuple[str, str, str]]:
    """(name, type, codec) as system.columns reports them."""
    cols = [(c.name, c.type, f"CODEC({c.codec})" if c.codec else "") for c in table.columns]
    cols.append((table.ingested_at.name, table.ingested_at.type, f"CODEC({table.ingested_at.codec})"))
    return cols + [(c.alias.name, c.alias.type, "") for c in table.aliases]


def normalise_codec(codec: str) -> str:
    """system.columns spells Delta as Delta(8), DoubleDelta as DoubleDelta(2) and Gorilla as Gorilla(8), the
    width of the column's type; compare without widths."""
    return re.sub(r"\b(Delta|DoubleDelta|Gorilla)\(\d\)", r"\1", codec)
