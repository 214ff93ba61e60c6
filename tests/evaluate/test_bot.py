"""The simulated remediation bot answers on simulated time, with what validation asked for."""

from __future__ import annotations

from fleetpulse.evaluate.bot import BotConfig, SimulatedBot


def event(action, ts, reason="", requirements=None, event_id="h1:1:x:1", **evidence):
    return {"event_id": event_id, "host": "h1", "action": action, "ts": ts, "reason": reason,
            "requirements": requirements or {}, "evidence": evidence}


def test_answers_wait_for_simulated_time_and_come_out_oldest_first():
    bot = SimulatedBot(BotConfig(drain_s=60, repair_s={"reboot": 600, "reset": 120, "inspect": 1800}))
    bot.receive(event("repair", 1000.0, reason="reboot: fault xid:79 -> reboot (catalog)", event_id="h1:1:repair:2",
                      repair="reboot"))
    bot.receive(event("drain", 1000.0, event_id="h1:1:drain:1"))
    assert bot.due(1059.0) == []
    first = bot.due(1060.0)
    assert [(r.action, r.ts, r.ok) for r in first] == [("drain", 1060.0, True)]
    assert bot.due(1599.0) == [] and bot.waiting == 1
    assert [r.action for r in bot.due(1600.0)] == ["repair"]
    assert bot.answered == {"drain": 1, "repair": 1}


def test_unknown_repair_kind_takes_the_inspection_time():
    bot = SimulatedBot(BotConfig(repair_s={"inspect": 1800}))
    assert bot.delay(event("repair", 0.0, reason="reset: something odd", repair="polish")) == 1800


def test_validation_reports_measurements_that_meet_the_requirements():
    bot = SimulatedBot(BotConfig(validate_s=300, busbw_gbs=45))
    bot.receive(event("validate", 0.0, requirements={"dcgm_diag_level": 3, "nccl_busbw_min_gbs": 50.5}))
    (result,) = bot.due(300.0)
    assert result.measurements == {"dcgm_diag_level": 3.0, "nccl_busbw_gbs": 50.5}
    assert "r3 pass" in result.detail
