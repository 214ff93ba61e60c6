"""`fleetpulse query "SQL"`, and every read of the store by the page, the report, `up` and `evaluate`: as the
read-only analyst on a server, through the guard of sinks/query_guard.py on the embedded store.

On a server ClickHouse itself refuses what the analyst may not do (writes, DDL, file(), url(), remote(), SYSTEM) and
holds the analyst profile's limits. Should the analyst user a deployment names be able to write (readonly = 0, e.g.
one URL's user for every role), its reads go through the same guard as the embedded store's, which runs each
statement read-only within the settings' limits. The embedded store is asked through the sink that owns it while
one runs (only one process may open it)."""

from __future__ import annotations

import argparse
import sys
import threading
import urllib.error
import urllib.request

from core.clickhouse import QueryLimits, connect, said_error, store_error
from core.errors import StoreError
from core.settings import CommonSettings, load
from sinks.query_guard import QueryRefused
from sinks.store import run_guarded

REFUSALS = {497: "ACCESS_DENIED", 164: "READONLY", 452: "SETTING_CONSTRAINT_VIOLATION", 159: "TIMEOUT_EXCEEDED",
            396: "TOO_MANY_ROWS_OR_BYTES", 241: "MEMORY_LIMIT_EXCEEDED"}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", help="one SQL statement; rows print tab-separated, like clickhouse-client")


def ask_owner(settings: CommonSettings, sql: str, timeout: float = 300) -> bytes | None:
    """Ask the running sink that owns the embedded store to run the query; None only when no process listens on its
    port. A sink that is there but slow, or that refuses the statement, is an error here: opening the store it owns
    would only fail."""
    headers = {"Authorization": f"Bearer {settings.sink_token.get_secret_value()}"} if settings.sink_token else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{settings.sink_port}/query", data=sql.encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise StoreError(exc.read().decode(errors="replace").strip()) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return None
        raise StoreError(f"the store's owner on port {settings.sink_port} did not answer: {exc.reason}") from None
    except ConnectionRefusedError:
        return None
    except (TimeoutError, ConnectionError) as exc:
        raise StoreError(f"the store's owner on port {settings.sink_port} did not answer in {timeout:g} s: "
                         f"{exc!r}") from None


class _Analysts:
    """One analyst client per store and database, shared by a process's threads (no session: HTTP requests of
    several threads at once), with whether its user is read-only."""

    def __init__(self):
        self.lock = threading.Lock()
        self.clients: dict[str, tuple[object, bool]] = {}

    def get(self, settings: CommonSettings):
        key = f"{settings.clickhouse_dsn_as('analyst')}/{settings.clickhouse_database}"
        with self.lock:
            if key not in self.clients:
                client = connect(settings, "analyst")
                read_only = str(client.query("SELECT getSetting('readonly')").result_rows[0][0]) != "0"
                self.clients[key] = (client, read_only)
            return self.clients[key]


_analysts = _Analysts()


def query(settings: CommonSettings, sql: str, *, open_store: bool = True, timeout: float = 300) -> bytes:
    """The statement's raw output (tab-separated unless it names its own FORMAT). On the embedded store: from the
    sink that owns it, else from the store itself (unless `open_store` is false: then a StoreError while no owner
    answers)."""
    if settings.embedded_store:
        answer = ask_owner(settings, sql, timeout)
        if answer is not None:
            return answer
        if not open_store:
            raise StoreError("the sink that owns the store is not answering yet")
        client, read_only = connect(settings, "analyst"), False
    else:
        client, read_only = _analysts.get(settings)
    try:
        if not read_only:
            return run_guarded(client, sql, QueryLimits.of(settings))
        # sent as written (its FORMAT clause too; else the server's default, TabSeparated): ClickHouse judges it
        return client.raw_query(sql.strip().removesuffix(";"), fmt=None)
    except QueryRefused:
        raise
    except Exception as exc:
        raise refused(exc, settings) from exc


def refused(exc: Exception, settings: CommonSettings) -> StoreError:
    """What ClickHouse answered about the user's own statement, as the user reads it: its message without the
    client's wrapping, a refusal with the read-only user named, a missing table with the next step."""
    error = said_error(exc)
    if error.code is None:  # no answer from ClickHouse: what failed, in the client's words
        return store_error(exc, "query failed")
    if error.code in REFUSALS:
        user = settings.clickhouse_credentials("analyst")[0] or "the URL's user"
        return QueryRefused(f"ClickHouse refused it for the read-only analyst ({user}): {error}")
    if error.code in (60, 81):  # UNKNOWN_TABLE, UNKNOWN_DATABASE
        return said_error(exc, f"{error} — nothing is stored under that name in {settings.clickhouse_database} yet: "
                               "`./dev up` (or a running sink) stores a run")
    return error


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    sys.stdout.buffer.write(query(settings, args.sql))
    sys.stdout.flush()
    return 0
