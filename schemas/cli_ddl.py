"""`fleetpulse ddl`: print the ClickHouse DDL derived from the schemas."""

from __future__ import annotations

import argparse

from schemas.ddl import statements


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database", default=None, help="database name (default: settings)")
    p.add_argument("--topic-prefix", default=None, help="topic namespace (default: settings)")


def run(args: argparse.Namespace) -> int:
    from core.settings import CommonSettings, load

    settings = load(CommonSettings, clickhouse_database=args.database, topic_prefix=args.topic_prefix)
    for stmt in statements(settings.clickhouse_database, settings.topic_prefix, settings.retention):
        print(stmt + ";\n")
    return 0
