"""How stages write keyed state: a table key and its changelog record on the partition of the record that set it."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import faust


def put(table: faust.Table, partition: int, key: str, value: Any, stored: bytes | None = None) -> Awaitable:
    """Set a table key, writing its changelog record (`stored`, the value's JSON already encoded, when the value is
    an object) to `partition`: the partition of the source record.

    Table.__setitem__ takes the partition from faust's *current* event, which inside a take() batch is the
    batch's last event, not the one that carried this key; the state would then recover on the wrong worker.
    """
    table.data[key] = value
    if stored is None:
        return table.send_changelog(partition, key, value)  # done once the broker has it
    return table.send_changelog(partition, key, stored, value_serializer="raw")


def delete(table: faust.Table, partition: int, key: str) -> Awaitable:
    """Drop a table key and write its tombstone (a null value: compaction removes the key) to `partition`."""
    table.data.pop(key, None)
    return table.send_changelog(partition, key, None, value_serializer="raw")
