"""The cluster layout on real servers, as far as these machines go: two local ClickHouse servers as the two shards of
cluster `fleet`, each naming both in its `remote_servers` (native protocol), `fleetpulse ddl --cluster fleet` applied
on each node as that node runs it, the sink writing through the Distributed tables of one node, every record stored
once across the shards (a second sink reading the topics again adds nothing), and the analyst reading the whole
fleet through the other node, as the page and the report do.

What a node here cannot run (docs/cluster.md): `ON CLUSTER` (clickhouse-local has no DDL worker: Code 392) and
replication (a ReplicatedMergeTree replica never becomes active without the server's restarting thread and
interserver port; tried with ZooKeeper 3.9.5 from Maven Central: TABLE_IS_READ_ONLY). So each statement runs without
its ON CLUSTER clause, and each Replicated engine as the engine it replicates, with the deduplication window
replication gives it (tests/schemas/cluster_emulation.py `as_one_node`)."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import SecretStr

from core.clickhouse import ROLES, connect
from fleetpulse.clickhouse_server import LocalClickHouse
from fleetpulse.query import query
from fleetpulse.report import build
from schemas.ddl import statements
from schemas.layout import Layout
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings
from tests.conftest import free_ports
from tests.schemas.cluster_emulation import as_one_node
from tests.sinks.test_sink_end_to_end import produce, sample

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DATABASE, CLUSTER = "telemetry", "fleet"
PASSWORDS = {role: f"cluster-{role}-secret" for role in ROLES}


def remote_servers(tcp_ports: list[int]) -> str:
    shards = "".join(
        f"<shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>{port}</port>"
        f"<user>fleetpulse_writer</user><password>{PASSWORDS['writer']}</password></replica></shard>"
        for port in tcp_ports)
    return f"<remote_servers><{CLUSTER}>{shards}</{CLUSTER}></remote_servers>"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    ports = [free_ports(2) for _ in range(2)]
    config = remote_servers([tcp for _, tcp in ((p, p + 1) for p in ports)])
    servers = [LocalClickHouse(tmp_path_factory.mktemp(f"shard{k}"), http_port=p, tcp_port=p + 1,
                               users={role: (f"fleetpulse_{role}", PASSWORDS[role]) for role in ROLES},
                               extra_config=config, database=DATABASE) for k, p in enumerate(ports)]
    for server in servers:
        server.start()
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def settings_of(server: LocalClickHouse, **more) -> SinkSettings:
    roles = {f"clickhouse_{role}_{what}": (f"fleetpulse_{role}" if what == "user" else SecretStr(PASSWORDS[role]))
             for role in ROLES for what in ("user", "password")}
    return SinkSettings(clickhouse_url=server.url, clickhouse_database=DATABASE, clickhouse_cluster=CLUSTER,
                        sink_apply_schema=False, sink_http=False, sink_batch_max_seconds=0.2, **roles, **more)


async def test_the_sink_writes_through_one_node_and_the_analyst_reads_the_fleet_through_the_other(
        nodes, kafka_bootstrap, topic_prefix):
    for server in nodes:  # the owner applies the cluster DDL on each node, as that node runs it
        owner = connect(settings_of(server), "owner")
        for stmt in statements(Layout(DATABASE, CLUSTER), topic_prefix):
            owner.command(as_one_node(stmt))
    first = settings_of(nodes[0], kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix)
    hosts, ticks, now = 16, 20, time.time() - 600
    await produce(first, [sample(h, s, now) for s in range(ticks) for h in range(hosts)])
    expected = hosts * ticks * 8

    async def sink_until(settings: SinkSettings, done) -> ClickHouseSink:
        sink, stop = ClickHouseSink(settings), asyncio.Event()
        task = asyncio.create_task(run_sink(sink, stop))
        deadline = time.monotonic() + 120
        while not done(sink):
            assert not task.done() and time.monotonic() < deadline, sink.stats.as_dict()["tables"]["gpu_samples"]
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 60)
        return sink

    await sink_until(first, lambda sink: sink.stats.tables["gpu_samples"].rows >= expected)
    # a second sink, of another consumer group, starts from the topics' first records: it resumes after the stored
    # watermark, the highest offset any shard holds, and adds no row
    began = time.monotonic()
    again = await sink_until(first.model_copy(update={"sink_group_id": "fleetpulse-sink-again"}),
                             lambda sink: sink.stats.ready and time.monotonic() - began > 10)
    assert again.stats.tables["gpu_samples"].rows == 0 and again.stored

    shards = [connect(settings_of(server), "owner").query(
        "SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM gpu_samples_local").result_rows[0]
        for server in nodes]
    assert all(rows > 0 for rows, _ in shards) and sum(rows for rows, _ in shards) == expected, shards
    other = settings_of(nodes[1])  # the analyst, on the node the sink did not write to
    assert query(other, "SELECT count(), uniqExact(kafka_partition, kafka_offset), uniqExact(host) "
                        "FROM gpu_samples") == f"{expected}\t{hosts * ticks}\t{hosts}\n".encode()
    assert query(other, "SELECT sum(samples) FROM gpu_1m") == f"{expected}\n".encode()  # each shard's rollup, merged
    report = build(other, None, None)  # the report reads every table through the Distributed ones
    assert report is not None
    print(f"\nrows per shard (rows, records): {shards}")
