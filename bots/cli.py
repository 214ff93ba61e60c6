"""`fleetpulse bot slurm`: answer fleetpulse's drain events on a Slurm cluster until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal

from bots.ledger import Ledger
from bots.runner import BotRunner
from bots.settings import BotSettings
from bots.slurm.executor import SlurmExecutor
from core.errors import ConfigError
from core.settings import load
from schemas.provision import ensure_topics


def configure_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bot", required=True, metavar="KIND")
    sub.add_parser("slurm", help="drain, repair, validate and resume nodes with scontrol (FLEETPULSE_BOT_SLURM)",
                   description="Acts on fleet.drain.events for the nodes this Slurm cluster knows and answers on "
                               "fleet.remediation.results; docs/remediation.md says how.")


def run(args: argparse.Namespace) -> int:
    settings = load(BotSettings)
    config = settings.bot_slurm
    if shutil.which(config.scontrol) is None:
        raise ConfigError(f"FLEETPULSE_BOT_SLURM (bot_slurm.scontrol): {config.scontrol!r} not found")
    ledger = Ledger(settings.ledger_path(args.bot))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix,
                            replication=settings.replication)
        await BotRunner(settings, SlurmExecutor(config), ledger, settings.bot_group_id, max_age_s=config.max_age_s,
                        max_concurrent=config.max_concurrent).run(stop)

    try:
        asyncio.run(main())
    finally:
        ledger.close()
    return 0
