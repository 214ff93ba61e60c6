"""The bot's durable record of what it was asked and what it did, so a restart neither repeats nor loses an action.

An append-only JSON-lines file, each line flushed and fsynced before the bot goes on: `accepted` (the event, written
before its offset is committed), `step` (an action taken or a check's outcome, written as soon as it happened),
`answered` (the result, written before it is sent) and `sent` (the broker acknowledged it). On start the file is read
back: answered events are never acted on again (a duplicate delivery is answered with the stored result), accepted
ones resume from their recorded steps, and answers not acknowledged are sent again.
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

    def __init__(self, path: Path, keep_s: float = 35 * 86_400.0):
        self.path = path
        self.entries: dict[str, Entry] = {}
        self.torn = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._load(keep_s)
        self._file = open(path, "a", encoding="utf-8")

    def _load(self, keep_s: float) -> None:
        if not self.path.exists():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
                self._apply(rec)
            except (ValueError, KeyError, TypeError):
                self.torn += 1  # a line cut by a crash mid-write: its step is taken as not done
        if self.torn:
            log.warning("ledger %s: %d unreadable line(s) skipped", self.path, self.torn)
        cutoff = time.time() - keep_s
        self.entries = {k: e for k, e in self.entries.items() if not (e.sent and e.at < cutoff)}
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
