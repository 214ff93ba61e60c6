"""Kafka offsets as the stack sees them: end offsets per topic and how far a consumer group trails them."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CoordinatorLoadInProgressError, GroupCoordinatorNotAvailableError, KafkaError


class OffsetWatch:
    """One long-lived client pair for polling end offsets and group commits."""

    def __init__(self, client_args: dict, partitions: dict[str, int]):
        """`partitions`: topic name on the cluster -> partition count (from the registry)."""
        self.consumer = AIOKafkaConsumer(**client_args, enable_auto_commit=False)
        self.admin = AIOKafkaAdminClient(**client_args)
        self.partitions = [TopicPartition(t, p) for t, n in partitions.items() for p in range(n)]

    async def start(self) -> None:
        await self.consumer.start()
        await self.admin.start()

    async def end_offsets(self) -> dict[TopicPartition, int]:
        return await self.consumer.end_offsets(self.partitions)

    async def group_lag(self, group: str, topics: list[str]) -> int | None:
        """Records in `topics` that `group` has not committed yet (a missing commit counts as all of them).

        None while the group's coordinator is not available yet (a group that is still forming).
        """
        ends = {tp: o for tp, o in (await self.end_offsets()).items() if tp.topic in topics}
        try:
            committed = await self.admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            return None
        lag = 0
        for tp, end in ends.items():
            meta = committed.get(tp)
            lag += end - (meta.offset if meta is not None and meta.offset >= 0 else 0)
        return lag

    async def groups_lag(self, groups: list[tuple[str, list[str]]]) -> int | None:
        """group_lag summed over (group, topics) pairs; None while any group is still forming."""
        total = 0
        for group, topics in groups:
            lag = await self.group_lag(group, topics)
            if lag is None:
                return None
            total += lag
        return total

    async def close(self) -> None:
        await self.consumer.stop()
        await self.admin.close()


def per_topic(offsets: dict[TopicPartition, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for tp, end in offsets.items():
        out[tp.topic] = out.get(tp.topic, 0) + end
    return out


async def stable_members(admin: AIOKafkaAdminClient, group: str) -> int:
    """Members of `group` while it is Stable (0 while it rebalances or has none, or the broker has no coordinator for it
    yet, as a fresh one has not): every member has joined and taken its partitions."""
    try:
        [response] = await admin.describe_consumer_groups([group])
    except (GroupCoordinatorNotAvailableError, CoordinatorLoadInProgressError):
        return 0
    return sum(len(g[5]) for g in response.groups if g[2] == "Stable")  # (error, id, state, _, _, members)
