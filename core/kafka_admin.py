"""Topic administration on whichever cluster is configured: create what is missing and wait for leaders, delete a namespace."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

from core.errors import BrokerError

log = logging.getLogger("fleetpulse.kafka")


async def why_unreachable(client_args: dict, timeout: float = 10) -> str:
    """What the bootstrap servers say to a client that cannot use them. A client's own error says only "Unable to
    bootstrap"; the cause — a wrong password, a certificate the CA does not know, nothing listening — is in a log line.
    Never the password: only the user name and mechanism are named."""
    from aiokafka.conn import create_conn

    keys = ("ssl_context", "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
    reasons = []
    for server in str(client_args["bootstrap_servers"]).split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(create_conn(host, int(port), **{k: client_args[k] for k in keys
                                                                           if k in client_args}), timeout)
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is the answer
            reasons.append(f"{server.strip()}: {_cause(exc, client_args)}")
            continue
        conn.close()
        return f"{server.strip()} accepts a connection; the failure came later"
    return "; ".join(reasons)


def _cause(exc: BaseException, client_args: dict) -> str:
    text = str(exc)
    if "Authentication" in text or "SaslAuthenticationFailed" in type(exc).__name__:
        who = f"{client_args.get('sasl_mechanism')} as {client_args.get('sasl_plain_username')!r}"
        return f"authentication failed ({who}): {text}"
    if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__ or "CERTIFICATE" in text:
        return f"TLS handshake failed: {text}"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "no answer (timed out)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def create_missing(client_args: dict, wanted: list[NewTopic], timeout: float = 30,
                         aligned: dict[str, dict[str, str | None]] | None = None) -> list[str]:
    """Create whichever of `wanted` do not exist yet, then wait for their partition leaders. With `aligned` (a dict
    to fill), the topics that exist get their NewTopic's configs where theirs differ (see _align): for topics this
    caller owns, such as a worker's changelogs; what changed goes into `aligned`, topic -> {key: the old value}."""
    admin = AIOKafkaAdminClient(**client_args)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        await admin.close()
        raise BrokerError(f"Kafka refuses this client: {await why_unreachable(client_args)}") from exc
    try:
        existing = set(await admin.list_topics())
        missing = [nt for nt in wanted if nt.name not in existing]
        deadline = time.monotonic() + timeout
        if missing:
            await _create(admin, missing, deadline)
            await _wait_for_leaders(admin, missing, deadline)
        if aligned is not None:
            aligned.update(await _align(admin, [nt for nt in wanted if nt.name in existing]))
        return [nt.name for nt in missing]
    finally:
        await admin.close()


# CreateTopics answers per topic, and aiokafka raises for none of them: 0 created, 36 already there (another process
# made it between list and create), 7 timed out (the controller goes on creating it). Any other code (41 "not the
# controller" while a new cluster's quorum settles) means it was not created, and must be asked again: left as it
# is, the first metadata request for it would have the broker auto-create it with one partition.
_CREATED = {0, 7, 36}


async def _create(admin: AIOKafkaAdminClient, topics: list[NewTopic], deadline: float) -> None:
    while topics:
        response = await admin.create_topics(topics)
        refused = {topic: code for topic, code, *_ in response.topic_errors if code not in _CREATED}
        topics = [nt for nt in topics if nt.name in refused]
        if topics and time.monotonic() > deadline:
            raise BrokerError(f"the cluster did not create {len(topics)} topics (error codes {refused})")
        if topics:
            await asyncio.sleep(0.5)


_OWN = 1  # DescribeConfigs' config_source of a setting made on the topic itself (DYNAMIC_TOPIC_CONFIG)


async def _align(admin: AIOKafkaAdminClient, topics: list[NewTopic]) -> dict[str, dict[str, str | None]]:
    """Give each topic its NewTopic's configs where they differ; topic -> {key: the value it had (None: unset)}.
    AlterConfigs replaces the whole set of a topic's own settings, so its other own settings are sent along, kept.
    A topic the cluster will not describe or change (no DescribeConfigs/AlterConfigs right, a value it refuses) keeps
    what it has, with a warning that says how to set it by hand: the caller runs on, as it did before."""
    wanted = {nt.name: nt.topic_configs for nt in topics if nt.topic_configs}
    changed: dict[str, dict[str, str | None]] = {}
    alter = []
    described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in wanted]) \
        if wanted else []
    for res in (r for response in described for r in response.to_object()["resources"]):
        name = res["resource_name"]
        if res["error_code"]:
            _not_aligned(name, wanted[name], f"{res['error_message']} (error code {res['error_code']})")
            continue
        entries = res["config_entries"]
        now = {e["config_names"]: e["config_value"] for e in entries}
        own = {e["config_names"]: e["config_value"] for e in entries
               if e.get("config_source", -1) == _OWN or ("is_default" in e and not e["is_default"])}
        diff = {k: now.get(k) for k, v in wanted[name].items() if now.get(k) != v}
        if diff:
            changed[name] = diff
            alter.append(ConfigResource(ConfigResourceType.TOPIC, name, {**own, **wanted[name]}))
    for response in await admin.alter_configs(alter) if alter else ():
        for code, message, _, name in response.resources:
            if code:
                _not_aligned(name, wanted[name], f"{message} (error code {code})")
                changed.pop(name, None)
    return changed


def _not_aligned(topic: str, configs: dict[str, str], why: str) -> None:
    log.warning("%s keeps its settings: the cluster refused %s: %s; set them with `kafka-configs --alter "
                "--entity-type topics --entity-name %s --add-config %s`", topic, configs, why, topic,
                ",".join(f"{k}={v}" for k, v in configs.items()))


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[NewTopic], deadline: float) -> None:
    """New topics refuse writes until every partition has a leader; wait so producers start clean. Asked without
    auto-creation: a broker that has not heard of a topic yet must not create it with its default partition count."""
    wanted = {nt.name: nt.num_partitions for nt in topics}
    while True:
        response = await admin._send_request(MetadataRequest(list(wanted), allow_auto_topic_creation=False))
        pending = [
            d["topic"] for d in response.to_object()["topics"]
            if d["error_code"] != 0 or len(d["partitions"]) != wanted.get(d["topic"])
            or any(p["leader"] < 0 for p in d["partitions"])
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"topics without a leader for each of their partitions: {', '.join(pending[:5])}")
        await asyncio.sleep(0.1)


async def delete_prefixed(client_args: dict, prefix: str) -> list[str]:
    """Delete every topic whose name starts with `prefix` (an evaluation run's namespace); returns their names."""
    if not prefix:
        raise ValueError("refusing to delete topics without a prefix")
    admin = AIOKafkaAdminClient(**client_args)
    await admin.start()
    try:
        names = sorted(t for t in await admin.list_topics() if t.startswith(prefix))
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()
