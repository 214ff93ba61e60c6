"""The layer contract (.importlinter): ops > roles (agents | streams | sinks | bots, apart) > schemas > core."""

from __future__ import annotations

from pathlib import Path

from importlinter import cli

REPO = Path(__file__).resolve().parents[1]


def test_each_layer_imports_only_the_layers_under_it(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    code = cli.lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True)
    report = capsys.readouterr().out
    assert code == cli.EXIT_STATUS_SUCCESS, report
    assert "0 broken" in report
