"""`fleetpulse agent`: run the host's collectors and publish through the spooling publisher, or `--once` diagnose."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Callable

import orjson

from agents.nvml import Nvml
from agents.registry import REGISTRY
from agents.runner import AgentRunner
from agents.settings import AgentSettings, load_agent_settings
from agents.spool import Spool, SpoolingPublisher
from core.errors import BrokerError, ConfigError
from schemas.provision import ensure_topics

log = logging.getLogger(__name__)
FAKE_FAULTS = {"lost": "lose_gpu", "reset": "require_reset", "wedge": "wedge", "dbe": "double_bit_error"}
HOST_FAKE_FAULTS = {"nvml_down": "driver_down"}  # KIND alone, no GPU: the whole library fails (a broken monitor)


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", metavar="FILE", help="settings file (TOML, or JSON by .json suffix); env vars win")
    p.add_argument("--collectors", metavar="A,B", help=f"override FLEETPULSE_AGENT_COLLECTORS ({', '.join(REGISTRY)})")
    p.add_argument("--once", action="store_true",
                   help="poll every collector once, print the messages as JSON and exit (publishes nothing)")
    p.add_argument("--fake-nvml", action="store_true", help="use the recorded 8x H100 host instead of the GPUs")
    p.add_argument("--fake-fault", action="append", default=[], metavar="KIND:GPU",
                   help=f"with --fake-nvml: inject a fault after start-up ({', '.join(FAKE_FAULTS)}), repeatable; "
                        f"or KIND alone for the whole host ({', '.join(HOST_FAKE_FAULTS)}: every NVML call fails)")
    return p


def _fake(args: argparse.Namespace) -> tuple[Nvml | None, list[tuple[str, int | None]]]:
    faults: list[tuple[str, int | None]] = []
    for spec in args.fake_fault:
        kind, sep, gpu = spec.partition(":")
        if kind in HOST_FAKE_FAULTS and not sep:
            faults.append((HOST_FAKE_FAULTS[kind], None))
        elif kind in FAKE_FAULTS and gpu.isdigit():
            faults.append((FAKE_FAULTS[kind], int(gpu)))
        else:
            raise ConfigError(f"--fake-fault {spec!r}: expected KIND:GPU with KIND one of {', '.join(FAKE_FAULTS)}, "
                              f"or one of {', '.join(HOST_FAKE_FAULTS)} alone")
    if faults and not args.fake_nvml:
        raise ConfigError("--fake-fault needs --fake-nvml")
    if not args.fake_nvml:
        return None, faults
    from agents.nvml.fake import FakeNvml

    return FakeNvml(), faults


async def _ensure_topics(settings: AgentSettings) -> None:
    """Create the registry's topics if missing (so nothing auto-creates them with the wrong partition count)."""
    try:
        async with asyncio.timeout(15):
            await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix,
                                replication=settings.replication)
    except Exception as exc:  # no broker yet, or no permission: records spool until the topics exist
        log.warning("could not check the topics on %s: %r", settings.bootstrap, exc)


async def serve(settings: AgentSettings, stop: asyncio.Event, *, nvml: Nvml | None = None,
                after_probe: Callable[[], None] | None = None) -> AgentRunner:
    """The agent proper: spool + publisher + metrics endpoint + collectors, until `stop` is set. The runner's last
    records (its "stopping" status) are handed over before publisher.close(), which delivers or spools them within
    agent_shutdown_timeout_s."""
    from agents.metrics import serve as serve_metrics

    spool = Spool(settings.spool_dir, max_bytes=settings.agent_spool_max_bytes, fsync=settings.agent_spool_fsync,
                  fsync_interval_s=settings.agent_spool_fsync_interval_s)
    publisher = SpoolingPublisher(settings, spool, client_id=f"fleetpulse-agent-{settings.agent_host}",
                                  stall_after_s=settings.agent_stall_after_s,
                                  shutdown_timeout_s=settings.agent_shutdown_timeout_s)
    runner = AgentRunner(settings, publisher=publisher, nvml=nvml)
    server = None
    try:
        await _ensure_topics(settings)
        await publisher.start()
        if settings.agent_metrics_port is not None:
            try:
                server = serve_metrics(runner, publisher, settings.agent_metrics_port, settings.agent_metrics_addr)
            except OSError as exc:
                raise ConfigError(f"FLEETPULSE_AGENT_METRICS_PORT {settings.agent_metrics_port}: {exc.strerror}") \
                    from exc
        await runner.run(stop, after_probe=after_probe)
    finally:
        await publisher.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        log.info("agent stopped: sent %d, spooled %d, replayed %d, dropped %d, %d left in the spool",
                 sum(publisher.sent.values()), publisher.spooled, publisher.replayed, publisher.dropped,
                 len(spool))
    return runner


async def _run(settings: AgentSettings, nvml: Nvml | None, after_probe: Callable[[], None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop, nvml=nvml, after_probe=after_probe)


def run(args: argparse.Namespace) -> int:
    settings = load_agent_settings(args.config, agent_collectors=args.collectors)
    nvml, faults = _fake(args)

    def inject() -> None:
        for method, gpu in faults:
            on = () if gpu is None else (gpu,)  # a host fault takes no GPU
            getattr(nvml, method)(*on)

    if not args.once:
        log.info("agent on %s: collectors %s every %gs -> %s (prefix %r), spool %s", settings.agent_host,
                 ",".join(settings.agent_collectors), settings.agent_interval_s, settings.bootstrap,
                 settings.topic_prefix, settings.spool_dir)
        try:
            asyncio.run(_run(settings, nvml, inject))
        except BrokerError as exc:
            print(f"agent: {exc}", file=sys.stderr)
            return 1
        return 0

    report = asyncio.run(AgentRunner(settings, nvml=nvml).once(after_probe=inject))
    sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()
    return 0 if any(c["supported"] for c in report["collectors"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    return run(configure_parser(argparse.ArgumentParser(prog="fleetpulse agent", description=__doc__)).parse_args(argv))
