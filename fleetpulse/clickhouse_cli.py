"""`fleetpulse clickhouse start|stop|status`: the project's local ClickHouse server (clickhouse_server.py)."""

from __future__ import annotations

import argparse
import json

from core.errors import ConfigError
from core.settings import CommonSettings, load
from fleetpulse.clickhouse_server import LocalClickHouse, ensure_clickhouse


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["start", "stop", "status"],
                   help="start or stop the local ClickHouse server, or say whether it runs (exit 1: not running)")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for readiness / shutdown")


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    if not settings.uses_local_clickhouse and args.action != "status":
        raise ConfigError("FLEETPULSE_CLICKHOUSE_URL names another store; the local server runs only when it is unset "
                          "(unset it, or start that store yourself)")
    if args.action == "start":
        print(ensure_clickhouse(settings, timeout=args.timeout))
        return 0
    if args.action == "stop":
        print("stopped" if LocalClickHouse.of(settings).stop(timeout=args.timeout) else "not running")
        return 0
    if settings.uses_local_clickhouse:
        status = LocalClickHouse.of(settings).status()
    else:
        try:
            status = {"store": ensure_clickhouse(settings, timeout=0), "external": True, "ready": True}
        except Exception as exc:
            status = {"external": True, "ready": False, "error": str(exc)}
    print(json.dumps(status, indent=2))
    return 0 if status["ready"] else 1
