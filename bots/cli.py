"""`fleetpulse bot slurm|kubernetes`: answer fleetpulse's drain events on one cluster until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal

from bots import metrics
from bots.config import BotConfig
from bots.ledger import Ledger
from bots.runner import BotRunner, Executor
from bots.settings import BotSettings
from core.errors import ConfigError
from core.settings import load
from schemas.provision import ensure_topics


def configure_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bot", required=True, metavar="KIND")
    sub.add_parser("slurm", help="drain, repair, validate and resume nodes with scontrol (FLEETPULSE_BOT_SLURM)",
                   description="Acts on fleet.drain.events for the nodes this Slurm cluster knows and answers on "
                               "fleet.remediation.results; docs/remediation.md says how.")
    sub.add_parser("kubernetes", help="cordon, taint, evict, repair, validate and return nodes through the API "
                                      "server (FLEETPULSE_BOT_KUBERNETES)",
                   description="Acts on fleet.drain.events for the nodes of this Kubernetes cluster and answers on "
                               "fleet.remediation.results; docs/remediation.md says how.")


def slurm_executor(settings: BotSettings) -> tuple[BotConfig, Executor]:
    from bots.slurm.executor import SlurmExecutor

    config = settings.bot_slurm
    if shutil.which(config.scontrol) is None:
        raise ConfigError(f"FLEETPULSE_BOT_SLURM (bot_slurm.scontrol): {config.scontrol!r} not found")
    return config, SlurmExecutor(config)


def kubernetes_executor(settings: BotSettings) -> tuple[BotConfig, Executor]:
    from kubernetes import client, config as kubeconfig

    from bots.kubernetes.executor import KubernetesExecutor

    config = settings.bot_kubernetes
    try:
        if config.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubeconfig.load_incluster_config()
        else:
            kubeconfig.load_kube_config(config_file=str(config.kubeconfig) if config.kubeconfig else None,
                                        context=config.context)
    except (kubeconfig.ConfigException, OSError, TypeError) as exc:
        raise ConfigError(f"FLEETPULSE_BOT_KUBERNETES (bot_kubernetes.kubeconfig): no usable cluster access: {exc}")
    return config, KubernetesExecutor(config, client.CoreV1Api())


def run(args: argparse.Namespace) -> int:
    settings = load(BotSettings)
    config, executor = {"slurm": slurm_executor, "kubernetes": kubernetes_executor}[args.bot](settings)
    ledger = Ledger(settings.ledger_path(args.bot))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix,
                            replication=settings.replication)
        group = settings.bot_group_id or settings.group_id(args.bot, await executor.cluster_id())
        logging.getLogger(__name__).info("bot %s: consumer group %s", args.bot, group)
        runner = BotRunner(settings, executor, ledger, group, max_age_s=config.max_age_s,
                           max_concurrent=config.max_concurrent)
        if settings.bot_metrics_port is not None:
            metrics.serve(args.bot, runner.counts, ledger, settings.bot_metrics_port, settings.bot_metrics_addr)
        await runner.run(stop)

    try:
        asyncio.run(main())
    finally:
        ledger.close()
    return 0
