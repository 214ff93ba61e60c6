"""ClickHouse clients for every process: which user each kind of work logs in as, and what each error the store
answers means for the caller (wait, split the batch, or stop).

Roles (ROLES): the sink inserts as `writer`; DDL and migrations run as `owner`; query, report, page, evaluation
read-backs and Grafana read as `analyst`, a read-only user whose limits the server enforces. Their users come from the
settings (core/settings.py `clickhouse_credentials`); the embedded store has no users, and reads there go through
sinks/query_guard.py instead.

Every error enters here once, through `store_error`: one table (ERRORS) maps ClickHouse's error codes to an action, so
no caller repeats a try/except of its own. What the table does not name stops the caller with the store's message:
waiting on an error nobody understood would hide it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from core.errors import StoreError
from core.settings import CommonSettings

ROLES = ("writer", "owner", "analyst")
WAIT, SPLIT, STOP = StoreError.WAIT, StoreError.SPLIT, StoreError.STOP

# code -> (ClickHouse's name, what mends it). Waiting mends a store that is away, busy, out of memory, quota, parts
# or disk (someone frees it), or between replicas; splitting mends rows a column cannot hold (the records behind them
# are set aside one by one); nothing the caller can do mends a missing table, a user without the right, or a query
# the store cannot parse.
ERRORS: dict[int, tuple[str, str]] = {
    3: ("UNEXPECTED_END_OF_FILE", WAIT),
    32: ("ATTEMPT_TO_READ_AFTER_EOF", WAIT),
    159: ("TIMEOUT_EXCEEDED", WAIT),
    160: ("TOO_SLOW", WAIT),
    201: ("QUOTA_EXCEEDED", WAIT),
    202: ("TOO_MANY_SIMULTANEOUS_QUERIES", WAIT),
    203: ("NO_FREE_CONNECTION", WAIT),
    209: ("SOCKET_TIMEOUT", WAIT),
    210: ("NETWORK_ERROR", WAIT),
    236: ("ABORTED", WAIT),
    241: ("MEMORY_LIMIT_EXCEEDED", WAIT),
    242: ("TABLE_IS_READ_ONLY", WAIT),  # a replica without its Keeper session
    243: ("NOT_ENOUGH_SPACE", WAIT),
    252: ("TOO_MANY_PARTS", WAIT),  # "Too many partitions for single INSERT block" shares the code: split (below)
    285: ("TOO_FEW_LIVE_REPLICAS", WAIT),
    286: ("UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE", WAIT),
    319: ("UNKNOWN_STATUS_OF_INSERT", WAIT),
    373: ("SESSION_IS_LOCKED", WAIT),
    394: ("QUERY_WAS_CANCELLED", WAIT),
    425: ("SYSTEM_ERROR", WAIT),
    439: ("CANNOT_SCHEDULE_TASK", WAIT),
    999: ("KEEPER_EXCEPTION", WAIT),
    1000: ("POCO_EXCEPTION", WAIT),
    6: ("CANNOT_PARSE_TEXT", SPLIT),
    27: ("CANNOT_PARSE_INPUT_ASSERTION_FAILED", SPLIT),
    38: ("CANNOT_PARSE_DATE", SPLIT),
    41: ("CANNOT_PARSE_DATETIME", SPLIT),
    53: ("TYPE_MISMATCH", SPLIT),
    69: ("ARGUMENT_OUT_OF_BOUND", SPLIT),
    70: ("CANNOT_CONVERT_TYPE", SPLIT),
    72: ("CANNOT_PARSE_NUMBER", SPLIT),
    117: ("INCORRECT_DATA", SPLIT),
    131: ("TOO_LARGE_STRING_SIZE", SPLIT),
    321: ("VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", SPLIT),
    349: ("CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN", SPLIT),
    469: ("VIOLATED_CONSTRAINT", SPLIT),
    16: ("NO_SUCH_COLUMN_IN_TABLE", STOP),
    47: ("UNKNOWN_IDENTIFIER", STOP),
    60: ("UNKNOWN_TABLE", STOP),
    62: ("SYNTAX_ERROR", STOP),
    81: ("UNKNOWN_DATABASE", STOP),
    164: ("READONLY", STOP),  # the user may not write: a setting of the user, not of the moment
    192: ("UNKNOWN_USER", STOP),
    194: ("REQUIRED_PASSWORD", STOP),
    195: ("IP_ADDRESS_NOT_ALLOWED", STOP),
    452: ("SETTING_CONSTRAINT_VIOLATION", STOP),
    497: ("ACCESS_DENIED", STOP),
    516: ("AUTHENTICATION_FAILED", STOP),
}
TOO_MANY_PARTITIONS = "Too many partitions for single INSERT block"
MESSAGE_MAX = 2000
_CODE = re.compile(r"\bCode: (\d+)\b")
_URL = re.compile(r"(with url: /)\S+")


@dataclass(frozen=True)
class QueryLimits:
    """What one analyst's answer may take: the local server's analyst profile holds them as constraints
    (fleetpulse/clickhouse_server.py), the guard of the embedded store as each statement's SETTINGS
    (sinks/query_guard.py)."""

    max_rows: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024
    max_seconds: float = 30.0
    max_memory_bytes: int = 2 * 1024**3

    @classmethod
    def of(cls, settings: CommonSettings) -> QueryLimits:
        return cls(settings.query_max_rows, settings.query_max_bytes, settings.query_max_seconds,
                   settings.query_max_memory_mb << 20)

    def settings(self) -> dict[str, int | float]:
        return {"max_result_rows": self.max_rows, "max_result_bytes": self.max_bytes,
                "max_execution_time": self.max_seconds, "max_memory_usage": self.max_memory_bytes}

    def clause(self) -> str:
        return (f"SETTINGS readonly=1, max_result_rows={self.max_rows}, max_result_bytes={self.max_bytes}, "
                f"result_overflow_mode='throw', max_execution_time={self.max_seconds:g}, "
                f"max_memory_usage={self.max_memory_bytes}")


def connect(settings: CommonSettings, role: str, *, database: str | None = None) -> Client:
    """A client on `database` (default: the settings' database) logged in as `role`'s user. The schema owner makes
    the database if it is missing, as does anyone on the embedded store (it has no users); for the writer and the
    analyst a missing database is an error (UNKNOWN_DATABASE)."""
    if role not in ROLES:
        raise ValueError(f"unknown ClickHouse role {role!r}; one of {ROLES}")
    database = database or settings.clickhouse_database
    dsn = settings.clickhouse_dsn_as(role)
    try:
        if settings.embedded_store:  # closing an embedded client can shut the in-process engine: kept open
            clickhouse_connect.get_client(dsn=dsn).command(f"CREATE DATABASE IF NOT EXISTS {database}")
            return clickhouse_connect.get_client(dsn=dsn, database=database)
        if role == "owner":
            bootstrap = clickhouse_connect.get_client(dsn=dsn, autogenerate_session_id=False)
            bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            bootstrap.close()
        return clickhouse_connect.get_client(dsn=dsn, database=database, autogenerate_session_id=False)
    except Exception as exc:
        error = store_error(exc, f"cannot open ClickHouse at {redact(dsn)} as the {role} "
                                 f"({settings.clickhouse_credentials(role)[0] or 'the URL’s user'})")
        if settings.uses_local_clickhouse and error.name == "unreachable":
            raise StoreError(f"the local ClickHouse server is not running (nothing answers on "
                             f"{settings.clickhouse_dsn}): start it with `fleetpulse clickhouse start`, or run "
                             "`./dev up`", action=WAIT, name="unreachable") from exc
        raise error from exc


def error_code(exc: BaseException) -> int | None:
    """ClickHouse's error code: the client's attribute, else the `Code: N` its message quotes."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    match = _CODE.search(str(exc))
    return int(match.group(1)) if match else None


def store_error(exc: BaseException, context: str) -> StoreError:
    """`exc` as a StoreError whose action says what mends it (ERRORS). The engine's message is cut at MESSAGE_MAX
    characters: it can quote the whole statement, data included."""
    if isinstance(exc, StoreError):
        return exc
    message = _URL.sub(r"\1…", str(exc))  # a failed request's URL carries the whole statement
    if len(message) > MESSAGE_MAX:
        message = message[:MESSAGE_MAX] + f"… ({len(message) - MESSAGE_MAX} more characters)"
    code = error_code(exc)
    if isinstance(exc, DataError):  # the client could not encode a value of a row
        action, name = SPLIT, "DataError"
    elif code == 252 and TOO_MANY_PARTITIONS in message:  # only a smaller insert mends this one
        action, name = SPLIT, "TOO_MANY_PARTITIONS"
    elif code in ERRORS:
        name, action = ERRORS[code]
    elif isinstance(exc, OperationalError) or (isinstance(exc, DatabaseError) and code is None):
        action, name = WAIT, "unreachable"  # refused, reset, timed out; a proxy's 502 before any ClickHouse answer
    else:
        action, name = STOP, f"code {code}" if code is not None else type(exc).__name__
    return StoreError(f"{context}: {message}", action=action, code=code, name=name)


def said(exc: BaseException) -> str:
    """What ClickHouse said, without the client's wrapping (its "Received ClickHouse exception …, server response:"
    in front, the server's version and the request's URL behind): for a message about a user's own statement."""
    text = str(exc).split("server response: ", 1)[-1].strip()
    return _TRAILER.sub("", text).strip()


def said_error(exc: BaseException, text: str | None = None) -> StoreError:
    """`exc` classified as store_error does it, its message what ClickHouse said (or `text`): an error about the
    user's own statement."""
    error = store_error(exc, "")
    return StoreError(said(exc) if text is None else text, action=error.action, code=error.code, name=error.name)


_TRAILER = re.compile(r"\s*\((?:version [\d.]+|for url [^)]*)\)")


def redact(dsn: str) -> str:
    """The URL with its user, password and any secret-looking query parameter replaced by ***: a password may hold an
    '@' (only the last one ends the user part) or come as ?password=…."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return dsn
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    tail = _SECRET_PARAM.sub(lambda m: m.group(1) + "***", tail)
    return f"{scheme}://{netloc}{slash}{tail}"


_SECRET_PARAM = re.compile(r"((?:^|[?&;])[^=&;]*(?:password|passwd|secret|token|key)[^=&;]*=)[^&;]*", re.IGNORECASE)
