"""`fleetpulse ddl`: print the ClickHouse DDL derived from the schemas."""

from __future__ import annotations

import argparse

from schemas.ddl import statements


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database", default=None, help="database name (default: settings)")
    p.add_argument("--topic-prefix", default=None, help="topic namespace (default: settings)")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="for a ClickHouse cluster of that name: replicated tables, Distributed tables over them, every "
                        "statement ON CLUSTER (docs/cluster.md); default: settings, or one server")


def run(args: argparse.Namespace) -> int:
    from core.settings import CommonSettings, load

    from schemas.layout import Layout

    settings = load(CommonSettings, clickhouse_database=args.database, topic_prefix=args.topic_prefix)
    layout = Layout(settings.clickhouse_database, args.cluster or settings.clickhouse_cluster)
    for stmt in statements(layout, settings.topic_prefix, settings.retention):
        print(stmt + ";\n")
    return 0
