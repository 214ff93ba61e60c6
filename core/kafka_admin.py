"""Topic administration on whichever cluster is configured: create what is missing and wait for leaders, delete a namespace."""

from __future__ import annotations

import asyncio
import ssl
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

from core.errors import BrokerError


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


async def create_missing(client_args: dict, wanted: list[NewTopic], timeout: float = 30) -> list[str]:
    """Create whichever of `wanted` do not exist yet, then wait for their partition leaders."""
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
