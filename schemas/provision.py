"""Creates the registry's topics (and their dead-letter topics) on whichever cluster is configured."""

from __future__ import annotations

from aiokafka.admin import NewTopic

from core.kafka_admin import create_missing
from schemas.topics import TOPICS

DLQ_RETENTION_MS = 30 * 24 * 3600 * 1000


def wanted_topics(prefix: str = "", replication: int = 1) -> list[NewTopic]:
    out = []
    for t in TOPICS.values():
        out.append(NewTopic(t.full(prefix), t.partitions, replication, topic_configs=t.config()))
        out.append(NewTopic(t.dlq(prefix), 1, replication, topic_configs={"retention.ms": str(DLQ_RETENTION_MS)}))
    return out


async def ensure_topics(client_args: dict, prefix: str = "", replication: int = 1, timeout: float = 30) -> list[str]:
    """Create the registry's missing topics and wait until every partition has a leader; returns the names created."""
    return await create_missing(client_args, wanted_topics(prefix, replication), timeout)


