"""`fleetpulse kafka start|stop|status`: the project's own broker (one node, or FLEETPULSE_LOCAL_KAFKA_NODES)."""

from __future__ import annotations

import argparse
import json

from fleetpulse.broker import ensure_broker, fetch_jars, local_broker
from core.settings import CommonSettings, load


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["start", "stop", "status", "jars"],
                   help="start or stop the local broker, say whether it runs, or fetch its jars only")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for readiness / shutdown")


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    broker = local_broker(settings)
    if args.action == "jars":
        print(fetch_jars())
    elif args.action == "start":
        print(ensure_broker(settings, timeout=args.timeout))
    elif args.action == "stop":
        print("stopped" if broker.stop(timeout=args.timeout) else "not running")
    else:
        status = broker.status() if settings.uses_local_kafka else {"bootstrap": settings.bootstrap, "external": True}
        print(json.dumps(status, indent=2))
        return 0 if status.get("ready", True) else 1
    return 0
