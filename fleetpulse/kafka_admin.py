"""Creates the registry's topics (and their dead-letter topics) on whichever cluster is configured."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import TOPICS


def wanted_topics(prefix: str = "", replication: int = 1) -> list[NewTopic]:
    out = []
    for t in TOPICS.values():
        out.append(NewTopic(t.full(prefix), t.partitions, replication, topic_configs=t.config()))
        out.append(NewTopic(t.dlq(prefix), 1, replication, topic_configs={"retention.ms": str(30 * 24 * 3600 * 1000)}))
    return out


async def ensure_topics(client_args: dict, prefix: str = "", replication: int = 1) -> list[str]:
    """Create missing topics; returns the names created. Existing topics are left as they are."""
    admin = AIOKafkaAdminClient(**client_args)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [nt for nt in wanted_topics(prefix, replication) if nt.name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them between list and create
        return [nt.name for nt in missing]
    finally:
        await admin.close()
