"""`fleetpulse migrate`: rebuild stored tables whose columns changed type, codec or name since they were created.

The sink applies one migration by itself (columns added since); anything else it refuses at start-up and names this
command. A table is rebuilt, not altered in place: a new table is made from the current DDL, every row is copied with
each column cast to its new type (a number that became an integer is rounded, a scaled column is computed from the
field it stores, `power_w` -> `power_mw`), the counts are compared, the two tables are exchanged, the table's
watermark view is made again, and the old rows are dropped (or kept under another name with --keep-old). Run it while
no sink writes to the store: rows inserted during the copy would be left in the old table.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from clickhouse_connect.driver.client import Client

from core.errors import StoreError
from schemas.columns import INTEGER_TYPES, Column, inner_type
from schemas.ddl import create_table, create_watermark_view
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
    client.command(create_table(table, database).replace(f"{database}.{table.name}\n", f"{database}.{new}\n", 1))
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
    client.command(create_watermark_view(table, database, topic_prefix))
    if not keep_old:
        client.command(f"DROP TABLE {database}.{old}")
    kept = f", the old one kept as {old}" if keep_old else ""
    return f"{table.name}: {after} rows copied into the current layout{kept}"


def drifting(client: Client, database: str) -> list[Table]:
    """The tables schema_drift finds different from the current layout (missing ones are only created)."""
    problems = [p for p in store.schema_drift(client, database) if not p.endswith(": missing")]
    return [t for name, t in TABLES.items() if any(p.startswith((f"{name}.", f"{name}:")) for p in problems)]


def migrate(client: Client, database: str, topic_prefix: str, keep_old: bool = False) -> list[str]:
    return [rebuild(client, database, table, topic_prefix, keep_old) for table in drifting(client, database)]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-old", action="store_true", help="keep each old table, renamed, instead of dropping it")


def run(args: argparse.Namespace) -> int:
    from core.settings import CommonSettings, load

    settings = load(CommonSettings)
    client = store.connect(settings)
    store.apply_schema(client, settings)
    done = migrate(client, settings.clickhouse_database, settings.topic_prefix, keep_old=args.keep_old)
    for line in done or ["every table already has the current layout"]:
        print(line)
    return 0
