"""The commands every bot runs (bots/commands.py), with real processes: an NVLink domain's shared repair runs once for
all the trays its incident drained, whichever tray's request comes first, and each tray is answered with it."""

from __future__ import annotations

import asyncio

from bots.commands import Commands
from bots.config import BotConfig
from bots.ledger import Ledger
from bots.runner import Steps


def tray(host: str, attempt: int = 1, incident: str | None = "c1/7") -> dict:
    evidence = {"repair": "reboot", "attempt": str(attempt),
                **({"incident": incident, "incident_since": "100010"} if incident else {})}
    return {"event_id": f"{host}:1:repair:{attempt + 1}", "host": host, "action": "repair", "ts": 100_100.0,
            "reason": "reboot: fault fabric_failed", "evidence": evidence, "requirements": {}}


def config(tmp_path, **more) -> BotConfig:
    ran = tmp_path / "ran"
    return BotConfig(repair_commands={"domain": ["sh", "-c", f"sleep 0.2; echo {{domain}} {{host}} >> {ran}"],
                                      **more})


async def repair_all(commands: Commands, ledger: Ledger, events: list[dict]):
    entries = [ledger.get(e["event_id"]) or ledger.accept(e) for e in events]
    return await asyncio.gather(*(commands.repair(commands.repair_kind(e), e, e["host"], Steps(ledger, entry))
                                  for e, entry in zip(events, entries)))


def test_the_domain_repair_runs_once_for_every_tray_of_the_incident(tmp_path):
    ledger, commands = Ledger(tmp_path / "ledger.jsonl"), Commands(config(tmp_path))
    trays = [tray(f"tray-{i:02d}") for i in range(5)]
    outcomes = asyncio.run(repair_all(commands, ledger, trays))
    assert (tmp_path / "ran").read_text() == "c1/7 tray-00\n"  # once, on the first tray's request
    assert all(o.ok for o in outcomes)
    assert "(the incident's one repair, run on tray-00:1:repair:2)" in outcomes[3].detail
    assert "run on" not in outcomes[0].detail and outcomes[0].detail.startswith("domain c1/7: sh -c")
    # the lifecycle asks again (a failed validation, a timeout): a new attempt runs the repair again, once
    asyncio.run(repair_all(commands, ledger, [tray("tray-01", attempt=2), tray("tray-02", attempt=2)]))
    assert (tmp_path / "ran").read_text() == "c1/7 tray-00\nc1/7 tray-01\n"


def test_a_restarted_bot_answers_a_tray_from_its_ledger_without_running_the_repair_again(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    asyncio.run(repair_all(Commands(config(tmp_path)), ledger, [tray("tray-00"), tray("tray-01")]))
    ledger.close()
    again = Ledger(path)
    [out] = asyncio.run(repair_all(Commands(config(tmp_path)), again, [tray("tray-01")]))
    assert out.ok and (tmp_path / "ran").read_text() == "c1/7 tray-00\n"


def test_without_a_domain_command_or_an_incident_each_tray_gets_its_own_repair(tmp_path):
    assert Commands(BotConfig()).repair_kind(tray("tray-00")) == "reboot"
    assert Commands(config(tmp_path)).repair_kind(tray("tray-00", incident=None)) == "reboot"
    assert Commands(config(tmp_path)).repair_kind({**tray("tray-00"), "action": "replace"}) == "replace"


def test_a_failed_domain_repair_fails_every_tray_it_was_run_for(tmp_path):
    commands = Commands(BotConfig(repair_commands={"domain": ["sh", "-c", "echo fabric manager down; exit 3"]}))
    outcomes = asyncio.run(repair_all(commands, Ledger(tmp_path / "l.jsonl"), [tray("tray-00"), tray("tray-01")]))
    assert [o.ok for o in outcomes] == [False, False]
    assert all("exit 3: fabric manager down" in o.detail for o in outcomes)


def test_a_domain_command_that_cannot_start_fails_every_tray_with_the_reason(tmp_path):
    commands = Commands(BotConfig(repair_commands={"domain": [str(tmp_path / "no-such-tool"), "{domain}"]}))
    outcomes = asyncio.run(repair_all(commands, Ledger(tmp_path / "l.jsonl"), [tray("tray-00"), tray("tray-01")]))
    assert [o.ok for o in outcomes] == [False, False]
    assert all("exit -1: FileNotFoundError" in o.detail for o in outcomes), outcomes
