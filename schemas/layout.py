"""Where the store's tables live: one server, or the shards and replicas of a ClickHouse cluster (docs/cluster.md).

On one server each table is what its name says. On a cluster each table's rows are kept in `{name}_local`, a
Replicated engine on every replica of every shard, and `{name}` is a Distributed table over them: the sink inserts
into it and analysts query it under the same names as on one server. Materialized views read and write the local
tables, so each shard feeds its own rollups and watermarks from the rows it was sent; every statement runs ON CLUSTER.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Layout:
    database: str = "fleetpulse"
    cluster: str | None = None

    def __post_init__(self) -> None:
        for what, name in (("database", self.database), ("cluster", self.cluster)):
            if name is not None and not NAME.match(name):
                raise ValueError(f"{what} name {name!r} is not a plain identifier")

    @property
    def on(self) -> str:
        """The ON CLUSTER clause of every statement (empty on one server)."""
        return f" ON CLUSTER {self.cluster}" if self.cluster else ""

    def local(self, name: str) -> str:
        """The table that keeps the rows of `name`, with its database."""
        return f"{self.database}.{name}_local" if self.cluster else f"{self.database}.{name}"

    def kept(self, stored: str) -> str | None:
        """The name whose rows the live table `stored` keeps: itself on one server, `x` for `x_local` on a cluster
        (None for a Distributed table there)."""
        if not self.cluster:
            return stored
        return stored.removesuffix("_local") if stored.endswith("_local") else None

    def tables(self, name: str) -> list[str]:
        """Every live table under the name `name`: itself, and on a cluster its local table too."""
        return [name, f"{name}_local"] if self.cluster else [name]

    def engine(self, engine: str, name: str, *args: str) -> str:
        """`engine` (a MergeTree family member) for the rows of `name`: replicated on a cluster, its replication path
        per shard in Keeper."""
        if self.cluster:
            args = (f"'/clickhouse/tables/{{shard}}/{self.database}/{name}_local'", "'{replica}'", *args)
            engine = f"Replicated{engine}"
        return f"{engine}({', '.join(args)})" if args else engine

    def dedup_setting(self) -> str:
        """How many recent inserts a table remembers to refuse a replayed one. Replicated tables deduplicate by
        default (a window of 1,000 on older servers); a one-server MergeTree only with a window set."""
        kind = "replicated" if self.cluster else "non_replicated"
        return f"{kind}_deduplication_window = 10000"

    def distributed(self, name: str, *shard_by: str) -> list[str]:
        """The Distributed table `name` over `name`_local, rows sent to a shard by the hash of the `shard_by` columns
        (none on one server)."""
        if not self.cluster:
            return []
        return [f"CREATE TABLE IF NOT EXISTS {self.database}.{name}{self.on} AS {self.local(name)}\n"
                f"ENGINE = Distributed({self.cluster}, {self.database}, {name}_local, "
                f"cityHash64({', '.join(shard_by)}))"]
