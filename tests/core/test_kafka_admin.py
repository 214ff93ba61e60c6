"""Topic creation on a real broker: every partition asked for, and never a topic made behind its back."""

from __future__ import annotations

import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from core.errors import BrokerError
from core.kafka_admin import _wait_for_leaders, create_missing

pytestmark = pytest.mark.integration


async def test_missing_topics_are_made_with_every_partition_and_only_once(kafka_bootstrap, topic_prefix):
    args = {"bootstrap_servers": kafka_bootstrap}
    wanted = [NewTopic(f"{topic_prefix}a", 4, 1), NewTopic(f"{topic_prefix}b", 2, 1)]
    assert await create_missing(args, wanted) == [f"{topic_prefix}a", f"{topic_prefix}b"]
    assert await create_missing(args, wanted) == []  # there now: nothing to do
    admin = AIOKafkaAdminClient(**args)
    await admin.start()
    try:
        described = {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics([nt.name for nt in wanted])}
    finally:
        await admin.close()
    assert described == {f"{topic_prefix}a": 4, f"{topic_prefix}b": 2}


async def test_waiting_for_a_topic_never_auto_creates_it(kafka_bootstrap, topic_prefix):
    """The local broker auto-creates topics on a metadata request; the wait must not ask for that: a topic whose
    creation failed would come back with one partition and look made."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        never = NewTopic(f"{topic_prefix}never", 4, 1)
        with pytest.raises(BrokerError, match="without a leader"):
            await _wait_for_leaders(admin, [never], time.monotonic() + 2)
        assert never.name not in await admin.list_topics()
    finally:
        await admin.close()
