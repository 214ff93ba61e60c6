"""ClickHouse connection (embedded chdb or a server), schema application and the live-schema check."""

from __future__ import annotations

import logging
import re
import tempfile
from datetime import datetime, timezone

from clickhouse_connect.driver.client import Client

from core.clickhouse import QueryLimits, connect, said, said_error, store_error
from core.errors import StoreError
from core.settings import CommonSettings
from schemas.ddl import (WATERMARKS, WIDE_PART_BYTES, days, expected_columns, normalise_codec, rollup_statements,
                         table_statements, ttl_expression)
from schemas.json_intake import SETTINGS as JSON_INTAKE_SETTINGS, JsonIntake
from schemas.layout import Layout
from schemas.rollups import ROLLUPS
from schemas.tables import TABLES
from sinks.query_guard import guarded

log = logging.getLogger("fleetpulse.store")

# Explicit on every insert: ClickHouse >= 26.2 changed the defaults (async inserts, deduplication). On a cluster the
# insert into a Distributed table returns once every shard stored its rows, under the same token (docs/cluster.md).
# A rollup view's GROUP BY is its table's sort key, so its block has one row per key already: merging the block again
# on insert (optimize_on_insert) and splitting its aggregation in 256 buckets (two-level) only cost. Off, a
# 50,000-row gpu_samples insert with its views peaked at 422 MB in the server instead of 1,764 MB, in 1.3 s
# instead of 2.5 s (ClickHouse 26.9, X-ClickHouse-Summary memory_usage; docs/scale.md).
INSERT_SETTINGS = {
    "async_insert": 0,
    "insert_deduplicate": 1,
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    "distributed_foreground_insert": 1,
    "optimize_on_insert": 0,
    "group_by_two_level_threshold": 0,
    "group_by_two_level_threshold_bytes": 0,
}

# The embedded engine parses in the sink's own process: one thread, so the stream worker beside it keeps its share
# of the CPU.
EMBEDDED_PARSE_SETTINGS = {"max_threads": 1, "input_format_parallel_parsing": 0}

# The sink's own records (the batch in flight, the rack inventory): never deduplicated, and on a cluster written
# before the call returns, like the data.
OWN_RECORD_SETTINGS = {"insert_deduplicate": 0, "distributed_foreground_insert": 1}


def layout(settings: CommonSettings) -> Layout:
    return Layout(settings.clickhouse_database, settings.clickhouse_cluster)


def prepare(settings: CommonSettings) -> list[str]:
    """As the schema owner: the database, then every table, rollup and view (apply_schema); the migrations run."""
    client = connect(settings, "owner")
    try:
        return apply_schema(client, settings)
    finally:
        if not settings.embedded_store:  # closing an embedded client can shut the in-process engine
            client.close()


def apply_schema(client: Client, settings: CommonSettings) -> list[str]:
    """Create every table, view and watermark table (idempotent), and add the columns the schemas gained since a table
    was made (returned, for the log). While the tables match the schemas, the rollups are made too (a rollup new to a
    store that holds rows is filled from them) and a retention changed in the settings is applied; a table that
    differs in another way is left for schema_drift to report and `fleetpulse migrate` to rebuild."""
    shape = layout(settings)
    database = shape.database
    existed = _tables(client, shape)
    _refuse_dropped_tables(client, settings, existed)
    for stmt in table_statements(shape, settings.topic_prefix, settings.retention):
        _command(client, stmt, f"DDL failed: {stmt.splitlines()[0]}")
    added = add_missing_columns(client, database, shape.cluster)
    if _table_drift(client, shape):
        return added
    for stmt in rollup_statements(shape, settings.retention):
        _command(client, stmt, f"DDL failed: {stmt.splitlines()[0]}")
    for rollup in ROLLUPS.values():
        if rollup.name not in existed and rollup.source in existed:
            log.info("filling the new rollup %s from the rows %s holds", rollup.name, rollup.source)
            for sql in rollup.aggregates(database):
                columns = [row[0] for row in client.query(f"DESCRIBE TABLE ({sql})").result_rows]
                _command(client, rollup.backfill(database, sql, columns), f"filling {rollup.name} failed")
    engines = _engines(client, shape)
    for table in _part_format_changes(engines):
        log.info("parts of %s are now written compact up to %d MB", table, WIDE_PART_BYTES >> 20)
        _command(client, f"ALTER TABLE {shape.local(table)}{shape.on} MODIFY SETTING min_bytes_for_wide_part = "
                         f"{WIDE_PART_BYTES}", f"changing the part format of {table} failed")
    for table, ttl in _retention_changes(engines, settings):
        log.info("retention of %s is now %s", table, ttl)
        _command(client, f"ALTER TABLE {shape.local(table)}{shape.on} MODIFY TTL {ttl}",
                 f"changing the retention of {table} failed")
    return added


def _refuse_dropped_tables(client: Client, settings: CommonSettings, existed: set[str]) -> None:
    """A table missing from a store that holds rows of its topic (its watermarks say so) was dropped: made anew, it
    would hold only what comes next, and its rollups would disagree with it. That stops the caller with the reason. A
    table missing from a store that never held its topic's rows is made (logged, where the store has other tables)."""
    missing = [t for t in TABLES.values() if t.name not in existed]
    if not missing or not existed:
        return
    held = {topic for topic, _ in watermarks(client)} if WATERMARKS in existed else set()
    dropped = [t for t in missing if t.topic.full(settings.topic_prefix) in held]
    if dropped:
        names = ", ".join(t.name for t in dropped)
        raise StoreError(f"{names} missing from {settings.clickhouse_database}, whose watermarks say rows of "
                         f"{', '.join(t.topic.full(settings.topic_prefix) for t in dropped)} were stored there: a table "
                         "was dropped (or the store damaged). Made anew, it would hold only what comes next and "
                         "disagree with its rollups; restore it, or drop the database to store what Kafka still holds "
                         "from the start", action=StoreError.STOP)
    for table in missing:
        log.warning("making the table %s, missing from a store that has the others", table.name)


def _tables(client: Client, shape: Layout) -> set[str]:
    """The tables that keep rows, by the name the sink and analysts use (on a cluster, those with a local table)."""
    rows = client.query("SELECT name FROM system.tables WHERE database = {db:String}",
                        parameters={"db": shape.database})
    return {kept for (name,) in rows.result_rows if (kept := shape.kept(name))}


def _command(client: Client, stmt: str, context: str) -> None:
    try:
        client.command(stmt)
    except Exception as exc:
        raise store_error(exc, context) from exc


def _engines(client: Client, shape: Layout) -> list[tuple[str, str]]:
    """(table, its live engine clause: settings and TTL included) for every table that keeps rows, by the name the
    sink and analysts use; on a cluster, its local table's and its Distributed table's."""
    rows = client.query("SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
                        parameters={"db": shape.database}).result_rows
    return [(kept, engine) for name, engine in rows if (kept := shape.kept(name))]


def _retention_changes(engines: list[tuple[str, str]], settings: CommonSettings) -> list[tuple[str, str]]:
    """(table, TTL expression) for every table whose live retention differs from the settings'."""
    live = {kept: m.group(1) for kept, engine in engines if (m := _TTL_DAYS.search(engine))}
    want = {t.name: (t.time_column, days(t.tier, settings.retention)) for t in TABLES.values()}
    want |= {r.name: (r.time_column, days("rollup", settings.retention)) for r in ROLLUPS.values()}
    return [(name, ttl_expression(column, n)) for name, (column, n) in want.items()
            if name in live and live[name] != str(n)]


def _part_format_changes(engines: list[tuple[str, str]]) -> list[str]:
    """The tables made before their parts were written compact up to WIDE_PART_BYTES (schemas/ddl.py)."""
    want = f"min_bytes_for_wide_part = {WIDE_PART_BYTES}"
    ours = set(TABLES) | set(ROLLUPS)
    return sorted(kept for kept, engine in engines if kept in ours and "MergeTree" in engine and want not in engine)


_TTL_DAYS = re.compile(r"\bTTL .*?toIntervalDay\((\d+)\)")


def add_missing_columns(client: Client, database: str, cluster: str | None = None) -> list[str]:
    """The one migration applied by itself: columns the schemas gained since a table was created are added in
    their place (old rows read the type's default); on a cluster to the local and the Distributed tables. Returns the
    statements run; any other difference (a type, a codec, a dropped or reordered column) is left for schema_drift to
    refuse."""
    shape = Layout(database, cluster)
    rows = client.query("SELECT table, name FROM system.columns WHERE database = {db:String}",
                        parameters={"db": database}).result_rows
    live: dict[str, set[str]] = {}
    for table, name in rows:
        live.setdefault(table, set()).add(name)
    applied = []
    for table in TABLES.values():  # on a cluster each of the two tables by itself: one may have the column already
        for target in shape.tables(table.name):
            have = live.get(target)
            if not have:
                continue
            prev = None
            # the stored columns, then (after the ingestion time) the aliases that read scaled ones in their unit
            added = [(c.name, c.ddl()) for c in table.columns] + [(table.ingested_at.name, None)]
            for name, ddl in added + [(c.alias.name, c.alias.ddl()) for c in table.aliases]:
                if name not in have and ddl is not None:
                    stmt = (f"ALTER TABLE {database}.{target}{shape.on} ADD COLUMN IF NOT EXISTS {ddl} "
                            + (f"AFTER `{prev}`" if prev else "FIRST"))
                    _command(client, stmt, f"migration failed: {stmt}")
                    applied.append(stmt)
                prev = name
    return applied


def schema_drift(client: Client, database: str, cluster: str | None = None) -> list[str]:
    """Differences between the live tables and rollups and the generated DDL; empty when they match."""
    shape = Layout(database, cluster)
    return _table_drift(client, shape) + _rollup_drift(client, shape)


def _table_drift(client: Client, shape: Layout) -> list[str]:
    live = _live_columns(client, shape)
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


def _rollup_drift(client: Client, shape: Layout) -> list[str]:
    """A rollup whose columns are not what its current SELECT returns (made by another version)."""
    live = _live_columns(client, shape)
    problems = []
    for rollup in ROLLUPS.values():
        have = [(n, t) for n, t, _ in live.get(rollup.name, [])]
        if not have:
            continue  # made by apply_schema once the tables match
        described = client.query(f"DESCRIBE TABLE ({rollup.aggregates(shape.database)[0]})").result_rows
        want = [(row[0], row[1]) for row in described] + list(rollup.more_columns)
        if have != want:
            changed = sorted({c[0] for c in set(have) ^ set(want)})
            problems.append(f"{rollup.name}: columns differ from its rollup's current SELECT: {changed}")
    return problems


def _live_columns(client: Client, shape: Layout) -> dict[str, list[tuple[str, str, str]]]:
    """(name, type, codec) per column of each table that keeps rows (on a cluster, the local tables)."""
    rows = client.query(
        "SELECT table, name, type, compression_codec FROM system.columns WHERE database = {db:String} "
        "ORDER BY table, position",
        parameters={"db": shape.database},
    ).result_rows
    live: dict[str, list[tuple[str, str, str]]] = {}
    for table, name, type_, codec in rows:
        if kept := shape.kept(table):
            live.setdefault(kept, []).append((name, type_, normalise_codec(codec)))
    return live


def watermarks(client: Client) -> dict[tuple[str, int], int]:
    """Highest stored offset per (topic, partition), derived from the data rows themselves."""
    rows = client.query("SELECT topic, partition, max(offset) FROM sink_watermarks GROUP BY topic, partition").result_rows
    return {(topic, int(part)): int(off) for topic, part, off in rows}


def topic_epochs(client: Client) -> dict[str, int]:
    """Per topic, how many times the sink found one of its partitions recreated (sink_topic_resets)."""
    rows = client.query("SELECT topic, count() FROM sink_topic_resets GROUP BY topic").result_rows
    return {topic: int(n) for topic, n in rows}


def record_inflight(client: Client, topic: str, token: str, epoch: int, ranges: dict[int, list[int]]) -> None:
    """The batch about to be inserted (sinks/inflight.py)."""
    spans = [(p, a, b) for p, (a, b) in sorted(ranges.items())]
    try:
        client.insert("sink_inflight", [(datetime.now(timezone.utc), topic, token, epoch, spans)],
                      column_names=["at", "topic", "token", "epoch", "ranges"], settings=OWN_RECORD_SETTINGS)
    except Exception as exc:
        raise store_error(exc, "cannot record the batch in flight") from exc


def last_inflight(client: Client) -> dict[str, tuple[str, int, dict[int, list[int]]]]:
    """Per topic, the last batch the sink set out to insert: (token, epoch, offset range per partition)."""
    rows = client.query("SELECT topic, argMax(token, at), argMax(epoch, at), argMax(ranges, at) FROM sink_inflight "
                        "GROUP BY topic").result_rows
    return {topic: (token, int(epoch), {int(p): [int(a), int(b)] for p, a, b in spans})
            for topic, token, epoch, spans in rows}


def record_rack_budgets(client: Client, budgets: dict[str, float]) -> None:
    """The rack power inventory of the settings, for the rack_1m view (each rack's latest budget counts)."""
    if not budgets:
        return
    now = datetime.now(timezone.utc)
    try:
        client.insert("rack_budgets", [(rack, watts, now) for rack, watts in sorted(budgets.items())],
                      column_names=["rack", "budget_w", "set_at"], settings=OWN_RECORD_SETTINGS)
    except Exception as exc:
        raise store_error(exc, "cannot record the rack budgets") from exc


def reset_watermark(client: Client, topic: str, partition: int, stored: int, log_end: int,
                    shape: Layout | None = None) -> None:
    """Record that `topic`[`partition`] was recreated (it ends at `log_end`, at or below the `stored` watermark), then
    drop its watermark, so its records are stored as new ones. In that order: should the sink stop between the two, it
    finds the same partition again on its next start and records a second reset, never loses one."""
    try:
        client.insert("sink_topic_resets", [(datetime.now(timezone.utc), topic, partition, stored, log_end)],
                      column_names=["at", "topic", "partition", "stored_before", "log_end"],
                      settings={"distributed_foreground_insert": 1})
        if shape is None or not shape.cluster:
            client.command("ALTER TABLE sink_watermarks DELETE WHERE topic = {t:String} AND partition = {p:UInt16}",
                           parameters={"t": topic, "p": partition}, settings={"mutations_sync": 2})
        else:  # every shard's watermarks; a topic name is [A-Za-z0-9._-] (Kafka's own rule), safe in quotes
            client.command(f"ALTER TABLE {shape.local('sink_watermarks')}{shape.on} DELETE WHERE topic = '{topic}' "
                           f"AND partition = {int(partition)}", settings={"mutations_sync": 2})
    except Exception as exc:
        raise store_error(exc, f"cannot reset the watermark of {topic}[{partition}]") from exc


def insert(client: Client, table: str, column_names: list[str], rows: list[tuple], token: str,
           max_partitions: int = 1000) -> None:
    """One durable insert; the token makes a retried or replayed batch a no-op. Tables are partitioned by day: past
    `max_partitions` days in one insert ClickHouse refuses it (code 252), and the caller inserts it in parts."""
    try:
        client.insert(table, rows, column_names=column_names,
                      settings={**INSERT_SETTINGS, "insert_deduplication_token": token,
                                "max_partitions_per_insert_block": max_partitions})
    except Exception as exc:
        raise store_error(exc, f"insert into {table} failed") from exc


def insert_lines(client: Client, table: str, intake: JsonIntake, lines: list[bytes], token: str, *,
                 embedded: bool, max_partitions: int = 1000) -> dict:
    """insert(), for a table whose rows the engine extracts from the records' JSON lines (schemas/json_intake.py): one
    INSERT ... SELECT, under the token, reading the lines from the request's body on a server, from a file the
    embedded engine reads (removed after) on chdb. Returns the server's summary of it (rows written, memory_usage);
    empty on chdb."""
    settings = {**INSERT_SETTINGS, **JSON_INTAKE_SETTINGS, "insert_deduplication_token": token,
                "max_partitions_per_insert_block": max_partitions}
    body = b"\n".join(lines)
    try:
        if not embedded:
            return client.command(intake.statement(table), data=body, settings=settings).summary
        with tempfile.NamedTemporaryFile(prefix="fleetpulse-lines-", suffix=".jsonl") as file:
            file.write(body)
            file.flush()
            client.command(intake.statement(table, file.name), settings={**settings, **EMBEDDED_PARSE_SETTINGS})
            return {}
    except Exception as exc:
        raise store_error(exc, f"insert into {table} failed") from exc


_EXPLAIN = "EXPLAIN AST "
_POSITION = re.compile(r"(position |line 1, col )(\d+)")


def run_guarded(client: Client, sql: str, limits: QueryLimits) -> bytes:
    """Raw output of one read-only statement within `limits` (sinks/query_guard.py), or QueryRefused / StoreError."""
    def ast_of(statement: str) -> str:
        try:  # command(): query() would append a FORMAT clause to the statement explained
            return str(client.command(f"{_EXPLAIN}{statement}"))
        except Exception as exc:  # ClickHouse's words about the user's statement, its positions in the user's text
            raise said_error(exc, _POSITION.sub(lambda m: f"{m.group(1)}{int(m.group(2)) - len(_EXPLAIN)}",
                                                said(exc))) from exc

    statement, fmt = guarded(ast_of, sql, limits)
    try:
        return client.raw_query(statement, fmt=fmt)
    except Exception as exc:
        raise said_error(exc) from exc
