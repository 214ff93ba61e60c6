"""The one `fleetpulse` command: role subcommands and one-shot diagnostics."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from core.errors import FleetpulseError
from core.logs import quiet_transient_client_logs

# name -> (module with configure_parser/run, help). Modules load only when their subcommand runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("fleetpulse.stack", "run broker, simulator, streams and sink with a live view"),
    "kafka": ("fleetpulse.broker_cli", "start, stop or check the local Kafka broker"),
    "clickhouse": ("fleetpulse.clickhouse_cli", "start, stop or check the local ClickHouse server"),
    "simulate": ("agents.simulator.cli", "publish a simulated GPU fleet (with ground truth)"),
    "agent": ("agents.cli", "run the host agent's collectors and publish"),
    "xid": ("agents.xid_cli", "parse XID/SXid kernel-log lines, or classify one code with the catalog"),
    "streams": ("streams.cli", "run a faust stream worker"),
    "evaluate": ("fleetpulse.evaluate.cli", "run a scenario through the real pipeline and score it against truth"),
    "bot": ("bots.cli", "run a remediation bot: act on drain events through a scheduler (Slurm or Kubernetes)"),
    "breaker": ("fleetpulse.breaker_cli", "show the fleet-wide drain breaker, or reset it after a trip"),
    "watch": ("fleetpulse.watch", "watch every consumer group's lag in time; raise PipelineLagging on the alert topic"),
    "sink": ("sinks.cli", "run the ClickHouse sink"),
    "query": ("fleetpulse.query", "run SQL on the store and print tab-separated rows"),
    "report": ("fleetpulse.report", "the fleet's outcomes over a time range: usable compute, interruptions, drains"),
    "migrate": ("sinks.migrate", "rebuild stored tables whose columns changed since they were made, rows included"),
    "page": ("fleetpulse.page", "serve the fleet page (a web dashboard over the store), or write its screenshot"),
    "grafana": ("fleetpulse.grafana", "write Grafana provisioning: the ClickHouse data source and the fleet dashboard"),
    "ddl": ("schemas.cli_ddl", "print the ClickHouse DDL generated from the schemas"),
    "schemas": ("schemas.cli_export", "export JSON Schema for every topic"),
    "reference": ("fleetpulse.reference", "write docs/settings.md and docs/commands.md from the code"),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """All subcommands are listed; only the chosen one's module is imported to add its options. The subcommands'
    parsers are kept on the parser (`commands`), so a flag one of them does not know is reported with its usage."""
    parser = argparse.ArgumentParser(prog="fleetpulse", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = {}
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        parser.commands[name] = p
        if name == chosen:
            importlib.import_module(module).configure_parser(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # partition assignments and coordinator chatter drown what operators need
        for noisy in ("aiokafka", "kafka", "faust", "mode"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        module = importlib.import_module(args._module)
        quiet_transient_client_logs()  # after the import: the client loggers exist now
        return module.run(args) or 0
    except FleetpulseError as exc:
        print(f"fleetpulse {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a broker that does not answer is a known condition, told with the next step
        from aiokafka.errors import KafkaConnectionError

        if not isinstance(exc, KafkaConnectionError):
            raise
        print(f"fleetpulse {args.command}: {unreachable_broker(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def unreachable_broker(exc: Exception) -> str:
    from core.settings import CommonSettings

    try:
        settings = CommonSettings()
    except Exception:  # a bad setting was reported before any client started
        return f"cannot reach the Kafka broker: {exc}"
    if settings.uses_local_kafka:
        return (f"nothing answers on {settings.bootstrap}, the project's local Kafka broker: start it with "
                "`fleetpulse kafka start` (or run `./dev up`), or name yours with KAFKA_BOOTSTRAP_SERVERS")
    return (f"cannot reach the Kafka broker at {settings.bootstrap} (KAFKA_BOOTSTRAP_SERVERS): {exc}; check that it "
            "runs and that this machine reaches it")


if __name__ == "__main__":
    sys.exit(main())
