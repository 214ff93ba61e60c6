"""`fleetpulse migrate`: rebuild stored tables whose columns changed type, codec or name since they were created.

The sink applies one migration by itself (columns added since); anything else it refuses at start-up and names this
command. A table is rebuilt, not altered in place: a new table is made from the current DDL, every row is copied with
each column cast to its new type (a number that became an integer is rounded, a scaled column is computed from the
field it stores, `power_w` -> `power_mw`), the counts are compared, the two tables are exchanged, the table's
watermark view is made again, and the old rows are dropped (or kept under another name with --keep-old). The rollups
fed from a rebuilt table keep their rows and are fed from the new one. A rollup whose own columns changed is made
again and filled from the raw rows the store still holds: what it summed from rows past their retention is gone (kept
under another name with --keep-old). Run it while no sink writes to the store: rows inserted during the copy would be
left in the old table.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from clickhouse_connect.driver.client import Client

from core.clickhouse import connect
from core.errors import StoreError
from schemas.columns import INTEGER_TYPES, Column, inner_type
from schemas.ddl import create_table, create_watermark_view
from schemas.layout import Layout
from schemas.rollups import ROLLUPS, Rollup
from schemas.tables import TABLES, Table
from sinks import store

def copy_expression(col: Column, live: dict[str, str]) -> str | None:
    """How one column of the current layout is computed from the live table's columns (None: not there, default)."""
    if col.alias and col.alias.name in live:  # the field itself is stored (the sink may have added col empty)
        return f"CAST({col.alias.stored_from} AS {col.type})"
    if col.name in live:
        source = f"`{col.name}`"
        if inner_type(col.type) in INTEGER_TYPES and inner_type(live[col.name]).startswith("Float"):
            source = f"round({source})"
        return f"CAST({source} AS {col.type})"
    return None


def live_columns(client: Client, database: str, table: str) -> dict[str, str]:
    rows = client.query("SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                        "AND default_kind != 'ALIAS' ORDER BY position", parameters={"db": database, "t": table})
    return dict(rows.result_rows)


def rebuild(client: Client, database: str, table: Table, topic_prefix: str, keep_old: bool) -> str:
    """Copy `table` into the current layout and swap it in; returns what was done, in one line."""
    live = live_columns(client, database, table.name)
    pairs = [(c.name, copy_expression(c, live)) for c in [*table.columns, table.ingested_at]]
    pairs = [(name, expr) for name, expr in pairs if expr is not None]
    new, old = f"{table.name}__migrating", f"{table.name}__before_{datetime.now(timezone.utc):%Y%m%d%H%M%S}"
    client.command(f"DROP TABLE IF EXISTS {database}.{new}")
    made = create_table(table, Layout(database))
    client.command(made.replace(f"{database}.{table.name}\n", f"{database}.{new}\n", 1))
    client.command(f"INSERT INTO {database}.{new} ({', '.join(f'`{n}`' for n, _ in pairs)}) "
                   f"SELECT {', '.join(e for _, e in pairs)} FROM {database}.{table.name}",
                   settings={"max_partitions_per_insert_block": 0, "insert_deduplicate": 0})
    before, after = (client.query(f"SELECT count() FROM {database}.{t}").result_rows[0][0] for t in (table.name, new))
    if before != after:
        client.command(f"DROP TABLE {database}.{new}")
        raise StoreError(f"{table.name}: copied {after} of {before} rows; the table was left as it was")
    here = f"{database}.{table.name}"
    client.command(f"RENAME TABLE {here} TO {database}.{old}, {database}.{new} TO {here}")
    client.command(f"DROP VIEW IF EXISTS {database}.{table.name}_watermark_mv")  # it followed the old table
    client.command(create_watermark_view(table, Layout(database), topic_prefix))
    for rollup in ROLLUPS.values():  # so did the rollups' views: apply_schema makes them again on the new table
        if rollup.source == table.name:
            for view in rollup.view_names():
                client.command(f"DROP VIEW IF EXISTS {database}.{view}")
    if not keep_old:
        client.command(f"DROP TABLE {database}.{old}")
    kept = f", the old one kept as {old}" if keep_old else ""
    return f"{table.name}: {after} rows copied into the current layout{kept}"


def rebuild_rollup(client: Client, database: str, rollup: Rollup, keep_old: bool) -> str:
    """Set aside a rollup made by another version; apply_schema makes it again and fills it from the raw rows."""
    for view in rollup.view_names():
        client.command(f"DROP VIEW IF EXISTS {database}.{view}")
    if keep_old:
        old = f"{rollup.name}__before_{datetime.now(timezone.utc):%Y%m%d%H%M%S}"
        client.command(f"RENAME TABLE {database}.{rollup.name} TO {database}.{old}")
        return f"{rollup.name}: set aside as {old}, to be refilled from {rollup.source}"
    client.command(f"DROP TABLE {database}.{rollup.name}")
    return f"{rollup.name}: dropped, to be refilled from {rollup.source}"


def drifting(client: Client, database: str) -> tuple[list[Table], list[Rollup]]:
    """The tables and rollups schema_drift finds different from the current layout (missing ones are only created)."""
    problems = [p for p in store.schema_drift(client, database) if not p.endswith(": missing")]

    def named(name: str) -> bool:
        return any(p.startswith((f"{name}.", f"{name}:")) for p in problems)

    return [t for t in TABLES.values() if named(t.name)], [r for r in ROLLUPS.values() if named(r.name)]


def migrate(client: Client, database: str, topic_prefix: str, keep_old: bool = False) -> list[str]:
    """Rebuild what drifted; the caller's apply_schema then makes the rollups and views over the new tables."""
    tables, rollups = drifting(client, database)
    return ([rebuild(client, database, table, topic_prefix, keep_old) for table in tables]
            + [rebuild_rollup(client, database, rollup, keep_old) for rollup in rollups])


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-old", action="store_true", help="keep each old table, renamed, instead of dropping it")


def run(args: argparse.Namespace) -> int:
    from core.settings import CommonSettings, load

    settings = load(CommonSettings)
    if settings.clickhouse_cluster:
        raise StoreError(f"fleetpulse migrate rebuilds tables on one server; cluster {settings.clickhouse_cluster}'s "
                         "tables are rebuilt shard by shard as docs/cluster.md describes")
    store.prepare(settings)
    client = connect(settings, "owner")
    done = migrate(client, settings.clickhouse_database, settings.topic_prefix, keep_old=args.keep_old)
    store.apply_schema(client, settings)
    for line in done or ["every table already has the current layout"]:
        print(line)
    return 0
