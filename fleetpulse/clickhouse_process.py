"""The local ClickHouse server's process (started by fleetpulse/clickhouse_server.py, never by hand): chdb-core's
engine, told to listen on the HTTP and native ports of the config.xml in its working directory, kept open by an idle
query. chdb reads that config when it is imported, so the process is started in its home folder."""

from __future__ import annotations

import sys

# The database every role lands in is made first (before anyone logs in: a user whose default database is missing
# cannot). The one-shot query's output format becomes the HTTP handler's default: TabSeparated, as a server's is (with
# CSV, clickhouse-connect's version probe fails). The idle query sleeps a second a row, for as long as numbers() counts.
SERVE = ("CREATE DATABASE IF NOT EXISTS {database}; SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; "
         "SELECT sleepEachRow(1) FROM numbers(9223372036854775807) "
         "SETTINGS function_sleep_max_microseconds_per_block = 0, max_block_size = 1")


def main(data_path: str, database: str) -> int:
    from chdb import _chdb

    result = _chdb.query(SERVE.format(database=database), "TabSeparated", path=data_path)
    if result.has_error():
        print(f"clickhouse: {result.error_message()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
