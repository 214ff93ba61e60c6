"""Every role's Prometheus metrics, from the catalogue each role declares beside its collector: docs/metrics.md is
written from here (`fleetpulse reference`), and tests/test_metrics_compliance.py holds each role to it."""

from __future__ import annotations

from dataclasses import dataclass

from core.metrics import SHARED, MetricSpec


@dataclass(frozen=True)
class Role:
    name: str
    command: str
    where: str  # how to reach its /metrics
    catalogue: tuple[MetricSpec, ...]


def roles() -> list[Role]:
    from agents import metrics as agent
    from agents.settings import AgentSettings
    from bots import metrics as bot
    from core.settings import CommonSettings
    from fleetpulse import page, watch
    from sinks import status as sink
    from streams import metrics_server as worker

    def port(cls: type, name: str) -> str:
        default = cls.model_fields[name].default
        return f"`FLEETPULSE_{name.upper()}` ({'off' if default is None else default} by default)"

    return [Role("agent", "fleetpulse agent", port(AgentSettings, "agent_metrics_port"), agent.CATALOGUE),
            Role("stream worker", "fleetpulse streams", port(worker_settings(), "streams_metrics_port") + ", one "
                 "port more per child process; `/healthz` beside it", worker.CATALOGUE),
            Role("sink", "fleetpulse sink", port(CommonSettings, "sink_port") + ", `/metrics` beside `/status`, "
                 "against a server and on the embedded store alike", sink.CATALOGUE),
            Role("bot", "fleetpulse bot", port(bot_settings(), "bot_metrics_port"), bot.CATALOGUE),
            Role("page", "fleetpulse page", port(CommonSettings, "page_port") + ", `/metrics` beside the page",
                 page.CATALOGUE),
            Role("lag watch", "fleetpulse watch", port(watch.WatchSettings, "watch_metrics_port"), watch.CATALOGUE)]


def worker_settings() -> type:
    from streams.settings import StreamsSettings

    return StreamsSettings


def bot_settings() -> type:
    from bots.settings import BotSettings

    return BotSettings


def exposed(spec: MetricSpec) -> str:
    """The name a scrape shows: a counter's with `_total`, a histogram's `_bucket`/`_sum`/`_count` beside it."""
    return f"{spec.name}_total" if spec.kind == "counter" else spec.name


def markdown() -> str:
    every = roles()
    out = ["# Metrics", "",
           "Written by `fleetpulse reference` from the catalogue each role declares beside its collector "
           "(core/metrics.py has the shared words); tests/test_docs.py checks this file is what the code writes, and "
           "tests/test_metrics_compliance.py that each role serves what it declares, under these names.", "",
           "## The shared words", "",
           "A role's metric is `fleetpulse_<role>_<thing>`; the same thing has the same name, kind and meaning in "
           "every role. Every endpoint also serves the process's own (`process_cpu_seconds_total`, "
           "`process_resident_memory_bytes`, ...).", "",
           "| thing | kind | meaning |", "|---|---|---|",
           *(f"| `{thing}` | {kind} | {meaning} |" for thing, (kind, meaning) in SHARED.items()), "",
           "| role | " + " | ".join(f"`{t}`" for t in SHARED) + " |", "|---|" + "---|" * len(SHARED)]
    for role in every:
        have = {spec.thing: spec for spec in role.catalogue if spec.thing}
        cells = [f"`{have[t].name}`" if t in have else "–" for t in SHARED]
        out.append(f"| {role.name} | " + " | ".join(cells) + " |")
    out += ["", "A stuck role cannot report its own lag: `fleetpulse watch` reads every consumer group's from the "
            "broker (`fleetpulse_pipeline_lag_seconds`) and raises `PipelineLagging` past `FLEETPULSE_WATCH_LAG_S`."]
    for role in every:
        out += ["", f"## {role.name} (`{role.command}`)", "", f"Served on {role.where}.", "",
                "| metric | kind | labels | meaning |", "|---|---|---|---|"]
        for spec in role.catalogue:
            labels = ", ".join(f"`{x}`" for x in spec.labels) or "–"
            out.append(f"| `{exposed(spec)}` | {spec.kind} | {labels} | {spec.help.replace('|', '/')} |")
    return "\n".join(out) + "\n"
