"""faust's tables as the runtime uses them: where a table's keys live, and a key set or dropped with its changelog record
on the partition of the record that set it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import faust


class Changelog(NamedTuple):
    """One table changelog record, encoded as faust's table recovery reads it, for the runtime to send."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None  # None: a tombstone


def put(table: faust.Table, partition: int, key: str, value: Any, stored: bytes | None = None) -> Changelog:
    """Set a table key; its changelog record (`stored`, the value's JSON already encoded, when the value is an
    object) goes to `partition`: the partition of the source record.

    Table.__setitem__ takes the partition from faust's *current* event, which inside a take() batch is the
    batch's last event, not the one that carried this key; the state would then recover on the wrong worker. And
    faust's own send goes through its producer buffer, a task that sends one record per turn of the event loop: a
    batch's changelog records waited behind other lanes' steps (~30 % of the telemetry lane's time at 1,000 hosts).
    """
    table.data[key] = value
    topic = table.changelog_topic
    raw = stored if stored is not None else topic.prepare_value(value, table.value_serializer)[0]
    return Changelog(topic.get_topic_name(), partition, topic.prepare_key(key, table.key_serializer)[0], raw)


def delete(table: faust.Table, partition: int, key: str) -> Changelog:
    """Drop a table key; its tombstone (a null value: compaction removes the key) goes to `partition`."""
    table.data.pop(key, None)
    topic = table.changelog_topic
    return Changelog(topic.get_topic_name(), partition, topic.prepare_key(key, table.key_serializer)[0], None)


def stored(table: Mapping) -> Mapping:
    """Where a table's keys live: the dict of faust's memory store, else the table's store (a plain mapping, as
    tests and benches pass, is its own). Reads, in-memory writes and roll-backs go straight to it: through the table,
    faust's per-key hooks (sensors, web statistics) cost ~2.5 µs a key, several keys per host sample."""
    store = getattr(table, "data", table)
    inner = getattr(store, "data", None)
    return inner if isinstance(inner, dict) else store
