"""Topic creation on a real broker: every partition asked for, never a topic made behind its back, and an owned
topic's settings brought up to date."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

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


async def _configs(args: dict, topic: str) -> dict[str, tuple[str, int]]:
    """A topic's settings on the broker: key -> (value, where it comes from: 1 the topic's own, 5 the default)."""
    admin = AIOKafkaAdminClient(**args)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    [res] = response.to_object()["resources"]
    return {e["config_names"]: (e["config_value"], e["config_source"]) for e in res["config_entries"]}


async def _settled_configs(args: dict, topic: str, key: str, value: tuple[str, int]) -> dict[str, tuple[str, int]]:
    """_configs once `key` reads `value` (a change goes through the KRaft controller: a broker may answer with the
    old value for a moment), or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while (configs := await _configs(args, topic))[key] != value and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return configs


async def test_an_existing_topic_is_aligned_only_when_asked_and_keeps_its_other_settings(kafka_bootstrap, topic_prefix):
    """A worker's changelog made by an earlier version (segments open for days) gets today's settings at start-up;
    what an operator set on it besides stays, and a topic whose settings match is left as it is."""
    args = {"bootstrap_servers": kafka_bootstrap}
    name = f"{topic_prefix}changelog"
    await create_missing(args, [NewTopic(name, 2, 1, topic_configs={"cleanup.policy": "compact",
                                                                   "max.message.bytes": "2000000"})])
    wanted = NewTopic(name, 2, 1, topic_configs={"cleanup.policy": "compact", "segment.ms": "600000"})
    assert await create_missing(args, [wanted]) == []  # not asked to align: untouched
    assert (await _configs(args, name))["segment.ms"] == ("604800000", 5)
    aligned: dict = {}
    assert await create_missing(args, [wanted], aligned=aligned) == []
    assert aligned == {name: {"segment.ms": "604800000"}}
    after = await _settled_configs(args, name, "segment.ms", ("600000", 1))
    assert after["segment.ms"] == ("600000", 1)
    assert after["cleanup.policy"] == ("compact", 1)
    assert after["max.message.bytes"] == ("2000000", 1)  # the topic's own setting, kept
    again: dict = {}
    await create_missing(args, [wanted], aligned=again)
    assert again == {}


async def test_settings_the_cluster_refuses_leave_the_topic_as_it_was_with_a_warning(kafka_bootstrap, topic_prefix,
                                                                                      caplog):
    """A cluster that will not take the settings (here a value it rejects; in production as often a missing
    AlterConfigs right) must not stop the caller: the topic keeps its settings and the log says how to set them."""
    args = {"bootstrap_servers": kafka_bootstrap}
    name = f"{topic_prefix}refused"
    await create_missing(args, [NewTopic(name, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    aligned: dict = {}
    with caplog.at_level("WARNING", logger="fleetpulse.kafka"):
        assert await create_missing(args, [NewTopic(name, 1, 1, topic_configs={"segment.ms": "-5"})],
                                    aligned=aligned) == []
    assert aligned == {}
    assert (await _configs(args, name))["segment.ms"] == ("604800000", 5)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "fleetpulse.kafka"]
    assert f"{name} keeps its settings" in warning and f"--entity-name {name} --add-config segment.ms=-5" in warning
