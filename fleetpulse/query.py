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


def ask_owner(settings: CommonSettings, sql: str, timeout: float = 300) -> bytes | None:
    """Ask the running sink to run the query; None only when no process listens on the query port. A sink that is
    there but slow, or that refuses the statement, is an error here: opening the store it owns would only fail."""
    headers = {"Authorization": f"Bearer {settings.query_token.get_secret_value()}"} if settings.query_token else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{settings.query_port}/query", data=sql.encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise StoreError(exc.read().decode(errors="replace").strip()) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return None
        raise StoreError(f"the store's owner on port {settings.query_port} did not answer: {exc.reason}") from None
    except ConnectionRefusedError:
        return None
    except (TimeoutError, ConnectionError) as exc:
        raise StoreError(f"the store's owner on port {settings.query_port} did not answer in {timeout:g} s: "
                         f"{exc!r}") from None


def query(settings: CommonSettings, sql: str, *, open_store: bool = True, timeout: float = 300) -> bytes:
    """The statement's raw output: from the sink that owns the embedded store, else from the store itself (unless
    `open_store` is false: then a StoreError while no owner answers), or from the server CLICKHOUSE_URL names."""
    if settings.embedded_store:
        answer = ask_owner(settings, sql, timeout)
        if answer is not None:
            return answer
        if not open_store:
            raise StoreError("the sink that owns the store is not answering yet")
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
