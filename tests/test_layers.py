"""The layer contract (.importlinter): ops > roles (agents | streams | sinks | bots, apart) > schemas > core."""

from __future__ import annotations

import logging
from pathlib import Path

from importlinter import cli

REPO = Path(__file__).resolve().parents[1]


def test_each_layer_imports_only_the_layers_under_it(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    # importlinter's CLI configures logging with dictConfig, which disables every logger that exists: a later test in
    # this process (tests/sinks/test_sink_store_refusals.py, under pytest-xdist) then never saw fleetpulse.sink's
    # warnings. Those loggers are put back as they were.
    enabled = [lg for lg in logging.root.manager.loggerDict.values()
               if isinstance(lg, logging.Logger) and not lg.disabled]
    try:
        code = cli.lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True)
    finally:
        for lg in enabled:
            lg.disabled = False
    report = capsys.readouterr().out
    assert code == cli.EXIT_STATUS_SUCCESS, report
    assert "0 broken" in report


def test_every_stage_package_is_in_the_no_stage_imports_another_contract():
    """A new stage is held apart from the others as soon as it exists, not when someone remembers the contract."""
    from streams import registry

    contract = (REPO / ".importlinter").read_text().split("[importlinter:contract:stages]", 1)[1]
    listed = {line.strip() for line in contract.split("modules =", 1)[1].splitlines() if line.strip()}
    packages = {step.run.__module__.rsplit(".", 1)[0] for stage in registry.select(None) for step in stage.steps}
    assert packages and packages <= listed, sorted(packages - listed)
