"""`fleetpulse query "SQL"`: answer from the store, through the process that owns it when one is running."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

from core.errors import StoreError
from core.settings import CommonSettings, load


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", help="one SQL statement; rows print tab-separated, like clickhouse-client")


def ask_owner(settings: CommonSettings, sql: str, timeout: float = 30) -> bytes | None:
    """Ask the running sink to run the query; None when no process serves the store."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{settings.query_port}/query", data=sql.encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise StoreError(exc.read().decode(errors="replace").strip()) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def query(settings: CommonSettings, sql: str) -> bytes:
    if settings.embedded_store:
        answer = ask_owner(settings, sql)
        if answer is not None:
            return answer
    from sinks.store import as_store_error, connect, run_sql

    client = connect(settings)
    try:
        return run_sql(client, sql)
    except Exception as exc:
        raise as_store_error(exc, "query failed") from exc


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    sys.stdout.buffer.write(query(settings, args.sql))
    sys.stdout.flush()
    return 0
