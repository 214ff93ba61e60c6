"""Keyed state for one step: reads through to the tables (streams/faust_adapter/tables.py), writes held until the
runtime flushes them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from streams.faust_adapter.tables import Changelog, delete, put, stored

_ABSENT = object()
_DELETED = object()  # a write that removes the key (a tombstone on the changelog)


class StepState:
    """The State a step gets. `child()` gives a trial view for one record, merged back only if its step succeeded.

    A `live` table's objects are lent to the step when `lend` is set (the runtime's first try at a batch): the step
    changes the stored object itself, no copy made; should the step raise, `roll_back()` puts every lent key back to
    its last durable value (`durable`: the JSON last sent to its changelog, kept by flush), as a restart would, and
    the runtime retries record by record on copies. Without `lend`, get() hands out copies.
    """

    def __init__(self, tables: Mapping[str, Any], partitions: Mapping[str, int],
                 parent: StepState | None = None, memo: dict[str, Any] | None = None,
                 live: Mapping[str, type] | None = None, durable: dict[tuple[str, str], bytes] | None = None,
                 lend: bool = False):
        self.tables, self.partitions, self.parent = tables, partitions, parent
        self.live = live if live is not None else (parent.live if parent is not None else {})
        self.memo = memo if memo is not None else (parent.memo if parent is not None else {})
        self.durable = durable if durable is not None else (parent.durable if parent is not None else {})
        self.lend = lend and parent is None
        self.lent: set[tuple[str, str]] = set()
        self.writes: dict[tuple[str, str], tuple[Any, bool, int | None]] = {}
        self.stored = {name: stored(t) for name, t in tables.items()} if parent is None else parent.stored

    def get(self, table: str, key: str, default: Any = None) -> Any:
        hit = self.writes.get((table, key), _ABSENT)
        if hit is not _ABSENT:
            return default if hit[0] is _DELETED else hit[0]
        found = self.parent.get(table, key, _ABSENT) if self.parent is not None else self.stored[table].get(key, _ABSENT)
        if found is _ABSENT:
            return default
        cls = self.live.get(table)
        if cls is None:
            return found
        if not isinstance(found, cls):  # as recovered from the changelog: its last durable value
            if (table, key) not in self.durable:
                self.durable[table, key] = orjson.dumps(found)
            return cls.from_json(found)
        if self.lend:
            self.lent.add((table, key))
            return found
        return found.copy()

    def roll_back(self) -> None:
        """After a step that raised: drop its writes, and put each lent object back to its last durable value."""
        self.writes.clear()
        for table, key in self.lent:
            data = self.stored[table]
            if (table, key) in self.durable:
                data[key] = orjson.loads(self.durable[table, key])
            else:
                data.pop(key, None)  # never durable: as lost as after a restart
        self.lent.clear()

    def scan(self, table: str, prefix: str = "") -> dict[str, Any]:
        """Every key of `table` starting with `prefix` and its value, the step's own writes included."""
        if self.parent is not None:
            found = self.parent.scan(table, prefix)
        else:
            cls = self.live.get(table)
            found = {k: v if cls is None or isinstance(v, cls) else cls.from_json(v)
                     for k, v in self.stored[table].items() if k.startswith(prefix)}
        for (t, k), v in self.writes.items():
            if t == table and k.startswith(prefix):
                if v[0] is _DELETED:
                    found.pop(k, None)
                else:
                    found[k] = v[0]
        return found

    def put(self, table: str, key: str, value: Any, *, durable: bool = True, partition: int | None = None) -> None:
        if table not in self.tables:
            raise KeyError(f"no state table {table!r}; declared: {', '.join(self.tables)}")
        prior = self.writes.get((table, key))
        if prior is not None:  # an earlier write of this batch: durable stays durable, a named partition stays named
            durable = durable or prior[1]
            partition = prior[2] if partition is None else partition
        if durable and partition is None:
            self._partition(self.tables[table], key, None)  # raises here, in the step: its record is set aside
        self.writes[(table, key)] = (value, durable, partition)

    def delete(self, table: str, key: str, *, partition: int | None = None) -> None:
        """Remove `key`: gone from the table, and a tombstone on the changelog (on `partition`, as put's)."""
        self.put(table, key, _DELETED, partition=partition)

    def child(self) -> StepState:
        return StepState(self.tables, self.partitions, parent=self)

    def merge(self) -> None:
        """Keep a trial view's writes in its parent."""
        for (table, key), (value, durable, partition) in self.writes.items():
            self.parent.put(table, key, value, durable=durable, partition=partition)

    def flush(self) -> list[Changelog]:
        """Write to the tables; returns the changelog records of the durable writes (on the source partition), for
        the runtime to send."""
        sent: list[Changelog] = []
        for (table, key), (value, durable, partition) in self.writes.items():
            t = self.tables[table]
            if value is _DELETED:
                self.durable.pop((table, key), None)
                sent.append(delete(t, self._partition(t, key, partition), key))
                continue
            if not durable:
                self.stored[table][key] = value
                continue
            stored = None
            if self.live.get(table) is not None:
                # Encoded once, as faust's JSON codec would (orjson, non-str keys): the changelog record, and the
                # value a roll_back returns to (bytes: to_json may share lists that later batches change in place).
                stored = self.durable[table, key] = orjson.dumps(value.to_json(), option=orjson.OPT_NON_STR_KEYS)
            sent.append(put(t, self._partition(t, key, partition), key, value, stored))
        self.writes.clear()
        return sent

    def _partition(self, table: Any, key: str, explicit: int | None) -> int:
        if explicit is not None:
            return explicit
        if key in self.partitions:
            return self.partitions[key]
        if (getattr(table, "partitions", None) or 1) == 1:
            return 0
        raise ValueError(f"state key {key!r} of {table.name} is no record's key in this batch: "
                         "the step must name its partition")
