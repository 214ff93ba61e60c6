"""The simulated remediation bot answers on simulated time, with what validation asked for."""

from __future__ import annotations

from fleetpulse.evaluate.bot import SimulatedBotConfig, SimulatedBot


def event(action, ts, reason="", requirements=None, event_id="h1:1:x:1", **evidence):
    return {"event_id": event_id, "host": "h1", "action": action, "ts": ts, "reason": reason,
            "requirements": requirements or {}, "evidence": evidence}


def test_answers_wait_for_simulated_time_and_come_out_oldest_first():
    bot = SimulatedBot(SimulatedBotConfig(drain_s=60, repair_s={"reboot": 600, "reset": 120, "inspect": 1800}))
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
    bot = SimulatedBot(SimulatedBotConfig(repair_s={"inspect": 1800}))
    assert bot.delay(event("repair", 0.0, reason="reset: something odd", repair="polish")) == 1800


def test_validation_reports_measurements_that_meet_the_requirements():
    bot = SimulatedBot(SimulatedBotConfig(validate_s=300, busbw_gbs=45))
    bot.receive(event("validate", 0.0, requirements={"dcgm_diag_level": 3, "nccl_busbw_min_gbs": 50.5}))
    (result,) = bot.due(300.0)
    assert result.measurements == {"dcgm_diag_level": 3.0, "nccl_busbw_gbs": 50.5}
    assert "r3 pass" in result.detail


def test_a_drain_after_the_job_waits_for_its_checkpoint_and_a_resend_now_replaces_it():
    """A suspect's drain (mode after_jobs) waits for the host's job to reach its next checkpoint, then takes the
    drain's time; the host's failure asks again at once (resend_of), and the first request is then never answered."""
    bot = SimulatedBot(SimulatedBotConfig(drain_s=60), checkpoint_after=lambda host, ts: 1800.0 if host == "h1" else None)
    bot.receive(event("drain", 1000.0, event_id="h1:1:drain:1", mode="after_jobs"))
    assert bot.due(1859.0) == []
    assert [(r.event_id, r.ts) for r in bot.due(1860.0)] == [("h1:1:drain:1", 1860.0)]
    bot.receive(event("drain", 1000.0, event_id="h1:2:drain:1", mode="after_jobs"))
    bot.receive(event("drain", 1200.0, event_id="h1:2:drain:2", mode="immediate", resend_of="h1:2:drain:1"))
    assert [(r.event_id, r.ts) for r in bot.due(4000.0)] == [("h1:2:drain:2", 1260.0)]
    assert bot.waiting == 0


def test_a_drain_after_the_job_on_an_idle_host_or_without_jobs_known_goes_at_once():
    idle = SimulatedBot(SimulatedBotConfig(drain_s=60), checkpoint_after=lambda host, ts: None)
    idle.receive(event("drain", 1000.0, mode="after_jobs"))
    blind = SimulatedBot(SimulatedBotConfig(drain_s=60))
    blind.receive(event("drain", 1000.0, mode="after_jobs"))
    assert [r.ts for r in idle.due(1060.0)] == [r.ts for r in blind.due(1060.0)] == [1060.0]


def test_the_trays_of_one_nvlink_domain_incident_share_one_repair():
    """The first tray's repair request starts the domain's repair; every tray of the incident is answered when it is
    done (a later request at once); another attempt is another repair."""
    bot = SimulatedBot(SimulatedBotConfig(repair_s={"reboot": 600, "domain": 900}))
    for host, ts in (("t1", 1000.0), ("t2", 1100.0), ("t3", 2500.0)):
        bot.receive({**event("repair", ts, event_id=f"{host}:1:repair:2", repair="reboot", incident="c1/7",
                             incident_since="900", attempt="1"), "host": host})
    bot.receive({**event("repair", 3000.0, event_id="t1:1:repair:3", repair="reboot", incident="c1/7",
                         incident_since="900", attempt="2"), "host": "t1"})
    assert [(r.host, r.ts) for r in bot.due(10_000.0)] == [("t1", 1900.0), ("t2", 1900.0), ("t3", 2500.0),
                                                           ("t1", 3900.0)]
    assert len(bot.shared) == 2
