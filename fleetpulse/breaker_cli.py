"""`fleetpulse breaker status|reset`: the fleet-wide drain breaker's state, and an operator's reset after a trip; the
fleet step's other command, the close of the last minute `up` sends when it stops."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import math
import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from core.errors import BrokerError
from core.settings import CommonSettings, load
from streams.lifecycle.usable_compute import known_nodes


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["status", "reset"], help="status: open or closed and why; reset: close it "
                   "after a trip (recorded with --by and --note)")
    p.add_argument("--by", default=None, help="who resets (recorded, and named in the resolved alert); default: you")
    p.add_argument("--note", default="", help="why it is safe to drain again")
    p.add_argument("--wait", type=float, default=30.0,
                   help="seconds to wait for the stream worker to apply the reset (0: send and return)")


def topics(prefix: str) -> tuple[str, str]:
    """The breaker's command topic and its state's changelog (see streams/lifecycle/stage.py)."""
    from streams.groups import app_id
    from schemas.topics import LIFECYCLE_FLEET

    return LIFECYCLE_FLEET.full(app_id(prefix)), f"{app_id(prefix)}-lifecycle-fleet-changelog"


async def read_state(client_args: dict, changelog: str, timeout: float = 30.0) -> dict:
    """The fleet step's table as it stands in its changelog: the newest value of every key."""
    consumer = AIOKafkaConsumer(**client_args, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(changelog, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end, state = (await consumer.end_offsets([tp]))[tp], {}
        deadline = time.monotonic() + timeout
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise BrokerError(f"reading {changelog} took longer than {timeout:.0f}s")
            for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                for r in records:
                    key = orjson.loads(r.key)
                    if r.value is None:
                        state.pop(key, None)
                    else:
                        state[key] = orjson.loads(r.value)
        return state
    finally:
        await consumer.stop()


def summary(state: dict, namespace: str) -> dict:
    breaker = state.get("breaker") or {}
    return {
        "namespace": namespace or "(none)",
        "breaker": "open" if breaker.get("open") else "closed",
        "reason": breaker.get("reason", ""),
        "opened_at": breaker.get("opened_at") or None,
        "denied_since_open": breaker.get("denied", 0),
        "trips": breaker.get("trips", 0),
        "admitted_total": breaker.get("admitted", 0),
        "drains_in_window": [{"ts": w[0], "host": w[1], **({"gpus": w[2]} if len(w) > 2 else {})}
                             for w in breaker.get("window", [])],
        "last_reset": breaker.get("last_reset") or None,
        "known_nodes": len(known_nodes(state)),
        "usable_compute": state.get("usable_compute"),
    }


async def _existing(client_args: dict, names: list[str]) -> set[str]:
    admin = AIOKafkaAdminClient(**client_args)
    await admin.start()
    try:
        return set(await admin.list_topics()) & set(names)
    finally:
        await admin.close()


async def status(settings: CommonSettings) -> dict:
    _, changelog = topics(settings.topic_prefix)
    args = settings.kafka_client_args()
    if changelog not in await _existing(args, [changelog]):
        raise BrokerError(f"no breaker state in namespace {settings.topic_prefix!r}: has the lifecycle stage run?")
    return summary(await read_state(args, changelog), settings.topic_prefix)


async def send_command(settings: CommonSettings, command: dict):
    """One command to the lifecycle's fleet step (an operator's reset, `up`'s closing of its last minute); returns
    the broker's record metadata (topic, partition, offset)."""
    command_topic, _ = topics(settings.topic_prefix)
    args = settings.kafka_client_args()
    if command_topic not in await _existing(args, [command_topic]):
        raise BrokerError(f"{command_topic} does not exist: no lifecycle stage has run in this namespace")
    producer = AIOKafkaProducer(**args, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        return await producer.send_and_wait(command_topic, orjson.dumps(command), key=b"fleet")
    finally:
        await producer.stop()


async def close_minutes(settings: CommonSettings, last_ts: float, wait: float = 30.0) -> float:
    """Tell the fleet step the fleet's clock stopped at `last_ts`: it reports usable compute for every minute up to
    the one holding it, which it would otherwise report only once later records arrive (streams/lifecycle/stage.py).
    Waits (up to `wait` s) until the lifecycle's worker has committed past the command, so its minutes are published.
    Returns the command's ts (the end of that minute)."""
    from streams.groups import group_id
    from streams.registry import STAGES

    ts = (math.floor(last_ts / 60) + 1) * 60.0
    sent = await send_command(settings, {"kind": "close", "ts": ts})
    group, where = group_id(settings.topic_prefix, STAGES["lifecycle"].worker), TopicPartition(sent.topic,
                                                                                              sent.partition)
    admin = AIOKafkaAdminClient(**settings.kafka_client_args())
    await admin.start()
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            committed = (await admin.list_consumer_group_offsets(group)).get(where)
            if committed is not None and committed.offset > sent.offset:
                break
            await asyncio.sleep(0.25)
    finally:
        await admin.close()
    return ts


async def reset(settings: CommonSettings, by: str, note: str, wait: float) -> tuple[dict | None, float]:
    """Send a reset command to the fleet step; with wait > 0, return the state once the worker applied it."""
    _, changelog = topics(settings.topic_prefix)
    ts = time.time()
    await send_command(settings, {"kind": "reset", "ts": ts, "by": by, "note": note})
    args = settings.kafka_client_args()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = await read_state(args, changelog)
        if ((state.get("breaker") or {}).get("last_reset") or {}).get("ts") == ts:
            return summary(state, settings.topic_prefix), ts
        await asyncio.sleep(0.5)
    return None, ts


def run(args: argparse.Namespace) -> int:
    settings = load(CommonSettings)
    if args.action == "status":
        print(json.dumps(asyncio.run(status(settings)), indent=2))
        return 0
    state, ts = asyncio.run(reset(settings, args.by or getpass.getuser(), args.note, args.wait))
    if state is None:
        print(json.dumps({"sent": True, "ts": ts, "applied": False,
                          "note": "no stream worker applied the reset yet; it will when the lifecycle stage runs"}))
        return 1 if args.wait > 0 else 0
    print(json.dumps(state, indent=2))
    return 0
