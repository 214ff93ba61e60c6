"""ClickHouse connection (embedded chdb or a server), schema application and the live-schema check."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from core.errors import StoreError
from core.settings import CommonSettings
from schemas.ddl import expected_columns, normalise_codec, statements
from schemas.tables import TABLES
from sinks.query_guard import QueryLimits, guarded, split

# Error codes worth retrying: timeouts, too many parts/simultaneous queries, memory, network, readonly replica.
RETRYABLE_CODES = {159, 164, 202, 209, 210, 241, 242, 252, 319, 425, 999}
# Errors about the rows themselves: no retry mends them, but the other rows of the insert can still be stored.
# CANNOT_PARSE_*, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE, INCORRECT_DATA, TOO_LARGE_STRING_SIZE,
# VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN, VIOLATED_CONSTRAINT.
BAD_ROW_CODES = {6, 27, 38, 41, 53, 69, 70, 72, 117, 131, 321, 349, 469}
# Code 252 is also "too many parts", which waiting mends; this one only a smaller insert does.
TOO_MANY_PARTITIONS = "Too many partitions for single INSERT block"

# Explicit on every insert: ClickHouse >= 26.2 changed the defaults (async inserts, deduplication).
INSERT_SETTINGS = {
    "async_insert": 0,
    "insert_deduplicate": 1,
    "deduplicate_blocks_in_dependent_materialized_views": 1,
}


def connect(settings: CommonSettings) -> Client:
    """A client on the configured database, creating the database if needed."""
    dsn = settings.clickhouse_dsn
    try:
        bootstrap = clickhouse_connect.get_client(dsn=dsn)
        bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {settings.clickhouse_database}")
        client = clickhouse_connect.get_client(dsn=dsn, database=settings.clickhouse_database)
        if not settings.embedded_store:  # closing an embedded client can shut the in-process engine
            bootstrap.close()
        return client
    except Exception as exc:
        raise as_store_error(exc, f"cannot open ClickHouse at {redact(dsn)}") from exc


def apply_schema(client: Client, settings: CommonSettings) -> None:
    """Create every table, view and watermark table (idempotent)."""
    for stmt in statements(settings.clickhouse_database, settings.topic_prefix):
        try:
            client.command(stmt)
        except Exception as exc:
            raise as_store_error(exc, f"DDL failed: {stmt.splitlines()[0]}") from exc


def add_missing_columns(client: Client, database: str) -> list[str]:
    """The one migration applied by itself: columns the schemas gained since a table was created are added in
    their place (old rows read the type's default). Returns the statements run; any other difference (a type, a
    codec, a dropped or reordered column) is left for schema_drift to refuse."""
    rows = client.query("SELECT table, name FROM system.columns WHERE database = {db:String}",
                        parameters={"db": database}).result_rows
    live: dict[str, set[str]] = {}
    for table, name in rows:
        live.setdefault(table, set()).add(name)
    applied = []
    for table in TABLES.values():
        have = live.get(table.name)
        if not have:
            continue
        prev = None
        for col in table.columns:
            if col.name not in have:
                stmt = (f"ALTER TABLE {database}.{table.name} ADD COLUMN IF NOT EXISTS {col.ddl()} "
                        + (f"AFTER `{prev}`" if prev else "FIRST"))
                try:
                    client.command(stmt)
                except Exception as exc:
                    raise as_store_error(exc, f"migration failed: {stmt}") from exc
                applied.append(stmt)
            prev = col.name
    return applied


def schema_drift(client: Client, database: str) -> list[str]:
    """Differences between the live tables and the generated DDL; empty when they match."""
    rows = client.query(
        "SELECT table, name, type, compression_codec FROM system.columns WHERE database = {db:String} "
        "ORDER BY table, position",
        parameters={"db": database},
    ).result_rows
    live: dict[str, list[tuple[str, str, str]]] = {}
    for table, name, type_, codec in rows:
        live.setdefault(table, []).append((name, type_, normalise_codec(codec)))
    problems = []
    for table in TABLES.values():
        want = [(n, t, normalise_codec(c)) for n, t, c in expected_columns(table)]
        have = live.get(table.name)
        if have is None:
            problems.append(f"{table.name}: missing")
            continue
        for w, h in zip(want, have):
            if w != h:
                problems.append(f"{table.name}.{w[0]}: expected {w[1]} {w[2]}, live {h[0]} {h[1]} {h[2]}".rstrip())
        if len(want) != len(have):
            extra = {h[0] for h in have} ^ {w[0] for w in want}
            problems.append(f"{table.name}: column sets differ: {sorted(extra)}")
    return problems


def watermarks(client: Client) -> dict[tuple[str, int], int]:
    """Highest stored offset per (topic, partition), derived from the data rows themselves."""
    rows = client.query("SELECT topic, partition, max(offset) FROM sink_watermarks GROUP BY topic, partition").result_rows
    return {(topic, int(part)): int(off) for topic, part, off in rows}


def topic_epochs(client: Client) -> dict[str, int]:
    """Per topic, how many times the sink found one of its partitions recreated (sink_topic_resets)."""
    rows = client.query("SELECT topic, count() FROM sink_topic_resets GROUP BY topic").result_rows
    return {topic: int(n) for topic, n in rows}


def reset_watermark(client: Client, topic: str, partition: int, stored: int, log_end: int) -> None:
    """Record that `topic`[`partition`] was recreated (it ends at `log_end`, at or below the `stored` watermark), then
    drop its watermark, so its records are stored as new ones. In that order: should the sink stop between the two, it
    finds the same partition again on its next start and records a second reset, never loses one."""
    try:
        client.insert("sink_topic_resets", [(datetime.now(timezone.utc), topic, partition, stored, log_end)],
                      column_names=["at", "topic", "partition", "stored_before", "log_end"])
        client.command("ALTER TABLE sink_watermarks DELETE WHERE topic = {t:String} AND partition = {p:UInt16}",
                       parameters={"t": topic, "p": partition}, settings={"mutations_sync": 2})
    except Exception as exc:
        raise as_store_error(exc, f"cannot reset the watermark of {topic}[{partition}]") from exc


def insert(client: Client, table: str, column_names: list[str], rows: list[tuple], token: str,
           max_partitions: int = 1000) -> None:
    """One durable insert; the token makes a retried or replayed batch a no-op. Tables are partitioned by day: past
    `max_partitions` days in one insert ClickHouse refuses it (code 252), and the caller inserts it in parts."""
    try:
        client.insert(table, rows, column_names=column_names,
                      settings={**INSERT_SETTINGS, "insert_deduplication_token": token,
                                "max_partitions_per_insert_block": max_partitions})
    except Exception as exc:
        raise as_store_error(exc, f"insert into {table} failed") from exc


def run_sql(client: Client, sql: str) -> bytes:
    """Raw output of one statement: tab-separated unless the statement names its own FORMAT."""
    body, fmt = split(sql)
    return client.raw_query(body, fmt=fmt)


def run_guarded(client: Client, sql: str, limits: QueryLimits) -> bytes:
    """Raw output of one read-only statement within `limits` (sinks/query_guard.py), or QueryRefused / StoreError."""
    def ast_of(statement: str) -> str:
        try:
            return client.raw_query(f"EXPLAIN AST {statement}", fmt="TabSeparated").decode()
        except Exception as exc:
            raise as_store_error(exc, "EXPLAIN AST failed") from exc

    statement, fmt = guarded(ast_of, sql, limits)
    try:
        return client.raw_query(statement, fmt=fmt)
    except Exception as exc:
        raise as_store_error(exc, "query failed") from exc


def as_store_error(exc: Exception, context: str) -> StoreError:
    """Decide retryable vs fatal at the edge, from the ClickHouse error code or the transport."""
    if isinstance(exc, StoreError):
        return exc
    code = getattr(exc, "code", None)
    if isinstance(exc, DataError) or code in BAD_ROW_CODES or (code == 252 and TOO_MANY_PARTITIONS in str(exc)):
        return StoreError(f"{context}: {exc}", bad_rows=True)  # DataError: the client could not encode a value
    retryable = isinstance(exc, OperationalError) or code in RETRYABLE_CODES
    if isinstance(exc, DatabaseError) and code is not None and code not in RETRYABLE_CODES:
        retryable = False
    return StoreError(f"{context}: {exc}", retryable=retryable)


def redact(dsn: str) -> str:
    """The URL with its user, password and any secret-looking query parameter replaced by ***: a password may hold an
    '@' (only the last one ends the user part) or come as ?password=…."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return dsn
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    tail = _SECRET_PARAM.sub(lambda m: m.group(1) + "***", tail)
    return f"{scheme}://{netloc}{slash}{tail}"


_SECRET_PARAM = re.compile(r"((?:^|[?&;])[^=&;]*(?:password|passwd|secret|token|key)[^=&;]*=)[^&;]*", re.IGNORECASE)
