"""The bot's durable record of what it was asked and what it did, so a restart neither repeats nor loses an action.

An append-only JSON-lines file, each line flushed and fsynced before the bot goes on: `accepted` (the event, written
before its offset is committed), `step` (an action taken or a check's outcome, written as soon as it happened),
`answered` (the result, written before it is sent) and `sent` (the broker acknowledged it). On start the file is read
back: known events are never acted on again (a duplicate delivery is dropped: its one answer is on the results
topic), accepted ones resume from their recorded steps, and answers not acknowledged are sent again. The file is
rewritten without settled events older than `keep_s` when read back and every `compact_every` lines.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Entry:
    event: dict
    steps: dict[str, dict] = field(default_factory=dict)
    result: dict | None = None
    sent: bool = False
    at: float = 0.0


class Ledger:
    """Events by id, in the order accepted. `keep_s` bounds the file: settled events older than it are dropped when
    it is read back (the drain topic's retention is 30 days)."""

    def __init__(self, path: Path, keep_s: float = 35 * 86_400.0, compact_every: int = 50_000):
        self.path, self.keep_s, self.compact_every = path, keep_s, compact_every
        self.entries: dict[str, Entry] = {}
        self.torn = 0
        self._lines = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    self._apply(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    self.torn += 1  # a line cut by a crash mid-write: its step is taken as not done
            if self.torn:
                log.warning("ledger %s: %d unreadable line(s) skipped", path, self.torn)
        self._compact()
        self._file = open(path, "a", encoding="utf-8")

    def maybe_compact(self) -> None:
        if self._lines >= self.compact_every:
            self._file.close()
            self._compact()
            self._file = open(self.path, "a", encoding="utf-8")

    def _compact(self) -> None:
        cutoff = time.time() - self.keep_s
        self.entries = {k: e for k, e in self.entries.items() if not (e.sent and e.at < cutoff)}
        self._lines = 0
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for event_id, e in self.entries.items():
                f.write(json.dumps({"accepted": e.event, "at": e.at}) + "\n")
                for name, detail in e.steps.items():
                    f.write(json.dumps({"step": event_id, "name": name, "detail": detail}) + "\n")
                if e.result is not None:
                    f.write(json.dumps({"answered": event_id, "result": e.result}) + "\n")
                if e.sent:
                    f.write(json.dumps({"sent": event_id}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)

    def _apply(self, rec: dict) -> None:
        if "accepted" in rec:
            event = rec["accepted"]
            self.entries.setdefault(event["event_id"], Entry(event=event, at=float(rec.get("at", 0.0))))
        elif "step" in rec:
            self.entries[rec["step"]].steps[rec["name"]] = rec.get("detail") or {}
        elif "answered" in rec:
            self.entries[rec["answered"]].result = rec["result"]
        elif "sent" in rec:
            self.entries[rec["sent"]].sent = True
        else:
            raise KeyError("unknown record")

    def _write(self, rec: dict) -> None:
        self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._lines += 1
        self._apply(rec)

    def get(self, event_id: str) -> Entry | None:
        return self.entries.get(event_id)

    def accept(self, event: dict) -> Entry:
        self._write({"accepted": event, "at": time.time()})
        return self.entries[event["event_id"]]

    def step(self, event_id: str, name: str, **detail) -> None:
        self._write({"step": event_id, "name": name, "detail": detail})

    def answer(self, event_id: str, result: dict) -> None:
        self._write({"answered": event_id, "result": result})

    def mark_sent(self, event_id: str) -> None:
        self._write({"sent": event_id})

    def unsettled(self) -> list[Entry]:
        """Accepted and not yet acknowledged, in the order accepted: to resume or to send again."""
        return [e for e in self.entries.values() if not e.sent]

    def close(self) -> None:
        self._file.close()
