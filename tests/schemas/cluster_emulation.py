"""Run the cluster DDL on the real engine, as far as one process can: `python -m tests.schemas.cluster_emulation DIR`.

Embedded ClickHouse (chdb) reads a server config that declares a one-shard cluster `fleet` whose replica is this
process, so Distributed tables, the insert through them and the views reading them run as on a server. What one
process cannot do is replication (it needs Keeper) and ON CLUSTER (each node runs the statement itself), so each
statement is run as a node would: without its ON CLUSTER clause, each Replicated engine as the engine it replicates,
with the deduplication window replication gives it. The same records are stored, through the sink's own insert,
into a one-server store and into the cluster store; both stores' views, raw tables and watermarks are printed as JSON
for the test to compare. Run in its own process: chdb reads its config once per process.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
from pathlib import Path

CONFIG = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <remote_servers><fleet><shard><replica><host>localhost</host><port>9000</port></replica></shard></fleet>
  </remote_servers>
</clickhouse>
"""
REPLICATED = re.compile(r"Replicated(\w*MergeTree)\('/clickhouse/tables/\{shard\}/\w+/\w+', '\{replica\}'(?:, )?")


def as_one_node(stmt: str) -> str:
    """What one node of the cluster runs for `stmt`, less replication."""
    stmt = stmt.replace(" ON CLUSTER fleet", "")
    stmt = REPLICATED.sub(r"\1(", stmt).replace("MergeTree()", "MergeTree")
    return re.sub(r"\breplicated_deduplication_window", "non_replicated_deduplication_window", stmt)


def rounded(rows: list[tuple]) -> list[tuple]:
    """Floats to 12 digits: a sum's last bit depends on the order its parts are added, which differs through a
    Distributed table."""
    return [tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in row) for row in rows]


def main(workdir: Path) -> None:
    (workdir / "config.xml").write_text(CONFIG)
    import chdb

    engine = chdb.connect(f":memory:?config-file={workdir / 'config.xml'}")  # the clients below share it
    atexit.register(engine.close)
    import clickhouse_connect

    from schemas.ddl import statements
    from schemas.layout import Layout
    from schemas.outcome_views import OUTCOME_VIEWS
    from schemas.rollup_views import VIEWS
    from schemas.tables import TABLES
    from sinks import store
    from tests.schemas.test_rollups import batches, records, straggler_rows

    clients = {}
    for name, layout in (("one", Layout("one")), ("fleet", Layout("fleet", "fleet"))):
        boot = clickhouse_connect.get_client(dsn="chdb://:memory:")
        for stmt in statements(layout, retention=None):
            boot.command(as_one_node(stmt))
        clients[name] = clickhouse_connect.get_client(dsn="chdb://:memory:", database=name)
    assert clients["fleet"].query("SELECT is_local FROM system.clusters WHERE cluster = 'fleet'").result_rows == [(1,)]

    parts = batches(records())
    out: dict[str, dict] = {}
    for name, client in clients.items():
        for rows, token in parts + [parts[0], parts[-1]]:  # two batches replayed with their tokens
            store.insert(client, "gpu_samples", TABLES["gpu_samples"].column_names, rows, token)
        rows = straggler_rows()
        store.insert(client, "stragglers", TABLES["stragglers"].column_names, rows, "stragglers|0:0-23")
        store.insert(client, "stragglers", TABLES["stragglers"].column_names, rows, "stragglers|0:0-23")
        store.record_rack_budgets(client, {"rack-000": 20_000.0})
        got: dict[str, object] = {view: rounded(client.query(f"SELECT * FROM {view} ORDER BY ALL").result_rows)
                                  for view in [*VIEWS, *OUTCOME_VIEWS]}
        got |= {f"rows:{t}": client.query(f"SELECT count() FROM {t}").result_rows[0][0] for t in TABLES}
        got["watermarks"] = sorted(store.watermarks(client).items())
        got["drift"] = store.schema_drift(client, name, "fleet" if name == "fleet" else None)
        got["engines"] = client.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase() "
                                      "ORDER BY name").result_rows
        out[name] = got
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(Path(sys.argv[1]))
