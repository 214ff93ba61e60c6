"""What `fleetpulse up` keeps of one run for the next: by default nothing (a fresh run: the last run's broker data,
rows, worker state and logs are removed before anything starts), or everything with --keep. Only the project's own
services' data under the data directory is ever removed, and only while they are stopped."""

from __future__ import annotations

import shutil
from pathlib import Path

from core.settings import CommonSettings
from fleetpulse.broker import local_broker
from fleetpulse.clickhouse_server import LocalClickHouse


def last_run(settings: CommonSettings) -> list[Path]:
    """The last run's data under the data directory: broker logs, the local server's rows (its config and passwords
    stay), the embedded store, the stream workers' state, the logs."""
    d = settings.data_dir
    found = [*d.glob("kafka"), *d.glob("kafka-*"), settings.local_clickhouse_home / "data", settings.chdb_path,
             *d.glob("streams*"), d / "logs"]
    return [p for p in found if p.exists()]


def start_fresh(settings: CommonSettings, keep: bool) -> str:
    """Remove the last run's data unless `keep`, or say why it stays; the line `up` prints about it."""
    if keep:
        return f"going on with the last run's data in {settings.data_dir} (--keep)"
    if not settings.uses_local_kafka or not (settings.uses_local_clickhouse or settings.embedded_store):
        return ("going on with the data of your own broker and store (KAFKA_BOOTSTRAP_SERVERS, "
                "FLEETPULSE_CLICKHOUSE_URL): up removes only its own services' data")
    running = [name for name, up in (("the local Kafka broker", local_broker(settings).status()["running"]),
                                     ("the local ClickHouse server", settings.uses_local_clickhouse
                                      and LocalClickHouse.of(settings).running)) if up]
    if running:
        return (f"{' and '.join(running)} already run{'s' if len(running) == 1 else ''}: going on with their data "
                "(stop them with `fleetpulse kafka stop` and `fleetpulse clickhouse stop` for a fresh run)")
    gone = last_run(settings)
    for path in gone:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if not gone:
        return f"a fresh run, its data in {settings.data_dir}"
    return (f"a fresh run: removed the last run's data in {settings.data_dir} "
            f"({', '.join(p.relative_to(settings.data_dir).as_posix() for p in gone)}); --keep goes on with it")


def where_it_lives(settings: CommonSettings) -> str:
    return (f"this run's data is in {settings.data_dir}: `./dev up --keep` goes on with it, the next `./dev up` "
            f"starts afresh, `rm -rf {settings.data_dir}` removes it now")
