"""`fleetpulse reference`: docs/settings.md, docs/commands.md and docs/metrics.md written from the code, every setting
(its environment variable, default and meaning, the JSON ones field by field), every command's flags and every role's
metrics, so the docs cannot drift from what the code reads (tests/test_docs.py checks the files are what this
writes, and that every setting and flag the other docs name exists)."""

from __future__ import annotations

import argparse
import json
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from fleetpulse import metrics_catalogue

ROLES = (("core.settings", "CommonSettings", "every process"),
         ("agents.settings", "AgentSettings", "the host agent (`fleetpulse agent`)"),
         ("streams.settings", "StreamsSettings", "the stream worker (`fleetpulse streams`)"),
         ("sinks.settings", "SinkSettings", "the sink (`fleetpulse sink`)"),
         ("bots.settings", "BotSettings", "the remediation bots (`fleetpulse bot`)"),
         ("fleetpulse.watch", "WatchSettings", "the lag watch (`fleetpulse watch`)"))


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("docs"), help="where to write the files (default %(default)s)")


def settings_classes() -> list[tuple[type, str]]:
    import importlib

    return [(getattr(importlib.import_module(module), name), who) for module, name, who in ROLES]


def env_name(cls: type, name: str) -> str:
    """The environment variable a field is read from (its first alias where it has some)."""
    alias = getattr(cls.model_fields[name].validation_alias, "choices", None)
    return str(alias[0]) if alias else f"{cls.model_config.get('env_prefix', '')}{name}".upper()


def env_names() -> set[str]:
    """Every environment variable (and alias) any settings class reads."""
    out = set()
    for cls, _ in settings_classes():
        for name, f in cls.model_fields.items():
            out.add(env_name(cls, name))
            out.update(str(a) for a in getattr(f.validation_alias, "choices", ()))
    return out


def _default(f) -> str:
    value = f.get_default(call_default_factory=True)
    if f.default_factory is not None and not isinstance(value, (BaseModel, list, dict, tuple)):
        return f"computed (`{f.default_factory.__name__}()`)"  # e.g. this host's name: not the same everywhere
    if value == "":
        return '""'
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return "see below"
    text = json.dumps(value, default=str) if isinstance(value, (list, dict, tuple)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _model(f) -> type[BaseModel] | None:
    kind = f.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def settings_markdown() -> str:
    out = ["# Settings", "",
           "Written by `fleetpulse reference` from the settings classes; do not edit by hand. Every setting is an "
           "environment variable; the JSON ones take an object whose fields are listed under them (any field left "
           "out keeps its default). A bad value stops the process at start-up with the variable named "
           "(docs/configuration.md tells how the settings fit together).", ""]
    seen: set[str] = set()
    nested: list[tuple[str, type[BaseModel]]] = []
    for cls, who in settings_classes():
        own = [n for n in cls.model_fields if n not in seen]
        seen.update(own)
        out += [f"## {who}", "", "| variable | default | meaning |", "|---|---|---|"]
        for name in own:
            f = cls.model_fields[name]
            env = env_name(cls, name)
            also = [str(a) for a in getattr(f.validation_alias, "choices", ())[1:]]
            out.append(f"| `{env}`{' (or ' + ', '.join(f'`{a}`' for a in also) + ')' if also else ''} | "
                       f"{_cell(_default(f))} | {_cell(f.description or '')} |")
            if (model := _model(f)) is not None:
                nested.append((env, model))
        out.append("")
    for env, model in nested:
        out += [f"## `{env}` (JSON)", "", _cell((model.__doc__ or "").strip().split("\n\n")[0]), "",
                "| field | default | meaning |", "|---|---|---|"]
        for name, f in model.model_fields.items():
            out.append(f"| `{name}` | {_cell(_default(f))} | {_cell(f.description or '')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    import importlib

    from fleetpulse.cli import COMMANDS

    out = {}
    for name, (module, help_text) in COMMANDS.items():
        p = argparse.ArgumentParser(prog=f"fleetpulse {name}", description=help_text,  # the same usage lines on
                                    formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100))  # any tty
        importlib.import_module(module).configure_parser(p)
        out[name] = p
    return out


def flags() -> dict[str, set[str]]:
    """Each command's option strings (--hosts, -n, ...) and its positional arguments' choices."""
    out = {}
    for name, p in _parsers().items():
        found = set()
        for action in p._actions:
            found.update(action.option_strings)
            if not action.option_strings and action.choices:
                found.update(action.choices)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found.update(o for a in sub._actions for o in a.option_strings)
        out[name] = found
    return out


def commands_markdown() -> str:
    from fleetpulse.cli import COMMANDS

    out = ["# Commands", "",
           "Written by `fleetpulse reference` from the commands' parsers; do not edit by hand. Run any of them as "
           "`./dev fleetpulse COMMAND` (or `fleetpulse COMMAND` inside `.venv`); `fleetpulse COMMAND --help` says "
           "the same.", ""]
    for name, p in _parsers().items():
        out += [f"## fleetpulse {name}", "", COMMANDS[name][1], "", "```", p.format_usage().strip(), "```", ""]
        rows = []
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):  # `fleetpulse bot slurm|kubernetes`
                rows += [f"| `{c.dest}` |  | {_cell(c.help or '')} |" for c in action._choices_actions]
                continue
            what = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
            if not action.option_strings and action.choices:
                what += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
            help_text = (action.help or "").replace("%(default)s", str(action.default))
            default = "" if action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or not action.option_strings \
                else f"`{action.default}`"
            rows.append(f"| {what} | {default} | {_cell(help_text)} |")
        if rows:
            out += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


def files() -> dict[str, str]:
    return {"settings.md": settings_markdown(), "commands.md": commands_markdown(),
            "metrics.md": metrics_catalogue.markdown()}


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0
