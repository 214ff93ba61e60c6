"""One table maps ClickHouse's answers to what mends them (core/clickhouse.py): wait, split the batch, or stop."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from core.clickhouse import ERRORS, store_error
from core.errors import StoreError


def server_error(code: int, text: str) -> DatabaseError:
    """What clickhouse-connect raises for a ClickHouse exception over HTTP (its code parsed into the message only)."""
    return DatabaseError(f"Received ClickHouse exception, code: {code}, server response: Code: {code}. "
                         f"DB::Exception: {text}. (version 26.9.2.1)")


@pytest.mark.parametrize("exc, action, name", [
    (OperationalError("Error HTTPConnectionPool(host='127.0.0.1', port=18123): Connection refused"), "wait",
     "unreachable"),
    (server_error(252, "Too many parts (3001) in table 'db.xid_events' (TOO_MANY_PARTS)"), "wait", "TOO_MANY_PARTS"),
    (server_error(201, "Quota for user `fleetpulse_writer` for 10s has been exceeded (QUOTA_EXCEEDED)"), "wait",
     "QUOTA_EXCEEDED"),
    (server_error(241, "Memory limit (total) exceeded (MEMORY_LIMIT_EXCEEDED)"), "wait", "MEMORY_LIMIT_EXCEEDED"),
    (server_error(252, "Too many partitions for single INSERT block (more than 100)"), "split", "TOO_MANY_PARTITIONS"),
    (server_error(469, "Constraint `ok` is violated (VIOLATED_CONSTRAINT)"), "split", "VIOLATED_CONSTRAINT"),
    (DataError("Unable to create Python array for UInt8 column"), "split", "DataError"),
    (server_error(60, "Table db.gpu_samples does not exist (UNKNOWN_TABLE)"), "stop", "UNKNOWN_TABLE"),
    (server_error(497, "fleetpulse_analyst: Not enough privileges (ACCESS_DENIED)"), "stop", "ACCESS_DENIED"),
    (server_error(164, "Cannot execute query in readonly mode (READONLY)"), "stop", "READONLY"),
    (server_error(516, "fleetpulse_writer: Authentication failed (AUTHENTICATION_FAILED)"), "stop",
     "AUTHENTICATION_FAILED"),
    (server_error(48, "Not implemented (NOT_IMPLEMENTED)"), "stop", "code 48"),  # not in the table: stop, said
    (DatabaseError("HTTP 502 Bad Gateway"), "wait", "unreachable"),  # a proxy, before any ClickHouse answer
])
def test_each_answer_maps_to_what_mends_it(exc, action, name):
    error = store_error(exc, "insert into t failed")
    assert (error.action, error.name) == (action, name)
    assert str(error).startswith("insert into t failed: ")
    assert error.retryable == (action == "wait") and error.bad_rows == (action == "split")


def test_code_164_readonly_is_a_setting_of_the_user_not_of_the_moment():
    """It once sat in the retryable list, with a comment about 242 (a replica without Keeper, which waiting mends)."""
    assert ERRORS[164] == ("READONLY", StoreError.STOP) and ERRORS[242] == ("TABLE_IS_READ_ONLY", StoreError.WAIT)


def test_a_long_message_is_cut():
    error = store_error(server_error(62, "Syntax error " + "x" * 5000), "DDL failed")
    assert len(str(error)) < 2200 and "more characters" in str(error)
