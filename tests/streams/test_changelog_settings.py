"""The worker's changelogs on a real broker: made with segments that close, and a changelog an earlier version made
(Kafka's 7-day segments) brought up to date at start-up, with the change logged."""

from __future__ import annotations

import pytest
from aiokafka.admin import NewTopic

from core.kafka_admin import create_missing
from streams.faust_adapter.app import create_app
from streams.faust_adapter.worker import changelog_topics, ensure_topics_of as _ensure_topics
from streams.settings import streams_settings
from tests.core.test_kafka_admin import _settled_configs

pytestmark = pytest.mark.integration


async def test_the_worker_makes_and_aligns_its_changelogs(settings_env, caplog):
    settings = streams_settings(None)
    app = create_app(settings, stages=["power_thermal"])
    old, new = changelog_topics(app, 1)
    args = settings.kafka_client_args()
    await create_missing(args, [NewTopic(old.name, old.num_partitions, 1, topic_configs={"cleanup.policy": "compact"})])
    with caplog.at_level("INFO", logger="fleetpulse.streams"):
        await _ensure_topics(settings, app)
    assert f"changelog {old.name}: segment.ms 604800000 -> 600000" in caplog.text
    assert f"changelog {new.name}:" not in caplog.text  # made now, with the setting: nothing to align
    for topic in (old.name, new.name):
        configs = await _settled_configs(args, topic, "segment.ms", ("600000", 1))
        assert (topic, configs["segment.ms"], configs["cleanup.policy"]) == (topic, ("600000", 1), ("compact", 1))
