"""The bot's ledger read back after a restart: what was answered stays answered, what was begun resumes."""

from __future__ import annotations

from bots.ledger import Ledger


def test_a_restart_sees_every_step_answer_and_acknowledgement(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    for k in range(3):
        ledger.accept({"event_id": f"e{k}", "host": "h1", "action": "drain"})
    ledger.step("e0", "marked", reason="fleetpulse: reset e0")
    ledger.answer("e0", {"event_id": "e0", "ok": True})
    ledger.mark_sent("e0")
    ledger.step("e1", "marked", at=5.0)
    ledger.answer("e1", {"event_id": "e1", "ok": False})
    ledger.close()

    again = Ledger(path)
    assert [e.event["event_id"] for e in again.unsettled()] == ["e1", "e2"]
    assert again.get("e0").sent and again.get("e0").steps == {"marked": {"reason": "fleetpulse: reset e0"}}
    assert again.get("e1").result == {"event_id": "e1", "ok": False} and not again.get("e1").sent
    assert again.get("e2").steps == {} and again.get("e2").result is None
    again.close()


def test_a_line_cut_by_a_crash_counts_as_not_written(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.accept({"event_id": "e0", "host": "h1", "action": "validate"})
    ledger.step("e0", "check:dcgm:started", at=1.0)
    ledger.close()
    with open(path, "a") as f:
        f.write('{"step":"e0","name":"check:dcgm:fini')  # the crash
    again = Ledger(path)
    assert again.torn == 1
    assert set(again.get("e0").steps) == {"check:dcgm:started"}
    again.step("e0", "check:dcgm:finished", rc=0)  # the file is whole again and grows from there
    again.close()
    assert Ledger(path).get("e0").steps["check:dcgm:finished"] == {"rc": 0}


def test_settled_events_past_the_keep_window_are_dropped_when_read_back(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.accept({"event_id": "old", "host": "h1", "action": "undrain"})
    ledger.answer("old", {"ok": True})
    ledger.mark_sent("old")
    ledger.accept({"event_id": "open", "host": "h1", "action": "drain"})
    ledger.close()
    kept = Ledger(path, keep_s=-1)  # everything settled is older than "now + 1 s"
    assert kept.get("old") is None and kept.get("open") is not None
