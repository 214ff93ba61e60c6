"""The Slurm bot's configuration: the shipped example loads, and a mistake stops start-up with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from bots.settings import BotSettings
from core.errors import ConfigError
from core.settings import load

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "bot-slurm.env.example"


def test_the_shipped_example_configuration_loads(monkeypatch):
    values = dict(line.split("=", 1) for line in EXAMPLE.read_text().splitlines() if line and not line.startswith("#"))
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    config = load(BotSettings).bot_slurm
    assert config.repair_commands["reset"][:2] == ["ssh", "{node}"]
    assert config.nccl_command[0] == "ssh"


@pytest.mark.parametrize("value, named", [
    ('{"repair_commands": {"reboat": ["x"]}}', "unknown repair kinds ['reboat']"),
    ('{"nccl_command": ["x", "{nod}"]}', "unknown placeholder"),
    ('{"dcgm_diag_command": []}', "an empty command"),
    ('{"poll_s": 0}', "poll_s"),
])
def test_a_bad_setting_is_refused_at_start_with_the_field_named(monkeypatch, value, named):
    monkeypatch.setenv("FLEETPULSE_BOT_SLURM", value)
    with pytest.raises(ConfigError, match="FLEETPULSE_BOT_SLURM") as err:
        load(BotSettings)
    assert named in str(err.value)
