"""`fleetpulse watch`: every consumer group's lag in time, read from the broker, and PipelineLagging raised and
resolved on the alert topic; the rule on records, then on a real broker."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from aiohttp.test_utils import TestClient, TestServer

from core.settings import CommonSettings, load
from fleetpulse import page
from fleetpulse.alert_feed import AlertFeed
from fleetpulse.watch import ALERTNAME, GroupLag, LagAlerts, LagWatch, WatchSettings, role_of, watch
from schemas.provision import ensure_topics
from schemas.topics import ALERTS, SAMPLES

T0 = 1_800_000_000.0


def lag(group: str, lag_s: float, topic: str = "fleet.telemetry.samples", records: int = 10) -> GroupLag:
    return GroupLag(group, role_of(group, ""), topic, records, lag_s, T0 - lag_s)


def test_a_group_past_the_threshold_fires_once_and_resolves_under_half_of_it_or_when_gone():
    alerts = LagAlerts(threshold_s=60)
    assert alerts.judge([lag("fleetpulse-sink", 59)], T0) == []
    [fired] = alerts.judge([lag("fleetpulse-sink", 75), lag("fleetpulse-streams", 0, records=0)], T0)
    assert (fired.alertname, fired.status, fired.severity, fired.value, fired.starts_at) == (
        ALERTNAME, "firing", "critical", 75, T0 - 75)
    assert fired.labels == {"group": "fleetpulse-sink", "role": "sink", "why": "behind",
                            "topic": "fleet.telemetry.samples", "topics": "fleet.telemetry.samples"}
    assert "the sink (consumer group fleetpulse-sink) is 75 s behind: 10 records" in fired.summary
    assert alerts.judge([lag("fleetpulse-sink", 200)], T0 + 10) == []  # told once
    assert alerts.judge([lag("fleetpulse-sink", 31)], T0 + 20) == []  # between half and the threshold: still firing
    [resolved] = alerts.judge([lag("fleetpulse-sink", 30)], T0 + 30)
    assert (resolved.status, resolved.fingerprint, resolved.ends_at) == ("resolved", fired.fingerprint, T0 + 30)
    alerts.judge([lag("fleetpulse-bot-slurm-c1", 90, topic="fleet.drain.events")], T0 + 40)
    [gone] = alerts.judge([], T0 + 50)  # the group no longer commits there (deleted, or moved on)
    assert (gone.status, gone.labels["group"]) == ("resolved", "fleetpulse-bot-slurm-c1")


def test_a_group_behind_on_several_topics_is_one_alert_named_by_its_worst():
    """A stopped sink trails on every topic it stores: one page for the sink, not one per topic."""
    alerts = LagAlerts(threshold_s=60)
    [fired] = alerts.judge([lag("fleetpulse-sink", 70, records=300), lag("fleetpulse-sink", 95, "fleet.alerts", 2),
                            lag("fleetpulse-sink", 0.0, "fleet.node.state", 0)], T0)
    assert (fired.value, fired.labels["topic"], fired.labels["topics"]) == (
        95, "fleet.alerts", "fleet.alerts,fleet.telemetry.samples")
    assert fired.evidence == {"records": 302.0, "lag_s": 95, "stalled_s": 0.0, "topics_behind": 2.0}
    assert alerts.judge([lag("fleetpulse-sink", 20, records=5), lag("fleetpulse-sink", 40, "fleet.alerts", 1)],
                        T0 + 10) == []  # one topic still over half the threshold: not yet
    [resolved] = alerts.judge([lag("fleetpulse-sink", 20, records=5)], T0 + 20)
    assert resolved.fingerprint == fired.fingerprint


def test_a_group_whose_records_wait_unmoved_fires_before_its_lag_reaches_the_threshold():
    """A stopped sink is seen by its stall (30 s unmoved) while its lag is still under 60 s; it resolves once it
    commits again and its lag is back under half the threshold."""
    alerts = LagAlerts(threshold_s=60, stall_s=30)
    stopped = GroupLag("fleetpulse-sink", "sink", "fleet.telemetry.samples", 900, 35, T0 - 35, stalled_s=30, stalled=8)
    assert alerts.judge([stopped], T0) == []  # not over 30 s yet
    [fired] = alerts.judge([replace(stopped, lag_s=45, stalled_s=40)], T0 + 10)
    assert (fired.status, fired.value, fired.threshold, fired.labels["why"]) == ("firing", 40, 30, "stalled")
    assert "has committed nothing for 40 s on 8 partitions while records wait (900 records" in fired.summary
    assert fired.evidence["stalled_s"] == 40 and fired.evidence["lag_s"] == 45
    catching_up = replace(stopped, lag_s=50, stalled_s=0.0, stalled=0)  # it moves again, still behind
    assert alerts.judge([catching_up], T0 + 20) == []
    [resolved] = alerts.judge([replace(catching_up, lag_s=12)], T0 + 30)
    assert (resolved.status, resolved.fingerprint) == ("resolved", fired.fingerprint)


def test_roles_by_group():
    assert [role_of(g, "p.") for g in ("p.fleetpulse-streams", "p.fleetpulse-streams-decisions", "p.fleetpulse-sink",
                                       "fleetpulse-bot-kubernetes-abc", "someone-else")] == [
        "streams", "streams", "sink", "bot", "someone-else"]


async def _commit(bootstrap: str, group: str, tp: TopicPartition, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


@pytest.mark.integration
async def test_a_stopped_consumer_is_lagging_in_time_a_caught_up_one_is_not_and_the_alert_comes_and_goes(
        kafka_bootstrap, topic_prefix):
    """Five samples published two minutes ago: the sink's group committed two of them (three left, the oldest 120 s
    old), the stream worker's all of them (a fleet gone quiet: nothing to take, no lag). The watch fires
    PipelineLagging for the sink alone on the real alert topic, and resolves it once the sink commits the rest."""
    client = {"bootstrap_servers": kafka_bootstrap}
    await ensure_topics(client, prefix=topic_prefix)
    tp = TopicPartition(SAMPLES.full(topic_prefix), 0)
    sent_at = time.time() - 120
    producer = AIOKafkaProducer(**client)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(tp.topic, b"{}", key=b"h", partition=0, timestamp_ms=int((sent_at + i) * 1000))
    finally:
        await producer.stop()
    sink, streams = f"{topic_prefix}fleetpulse-sink", f"{topic_prefix}fleetpulse-streams"
    await _commit(kafka_bootstrap, sink, tp, 2)
    await _commit(kafka_bootstrap, streams, tp, 5)
    settings = load(WatchSettings, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix,
                    watch_interval_s=0.2, watch_metrics_port="off")
    lag_watch = LagWatch(settings)
    await lag_watch.start()
    try:
        lags = {(x.group, x.topic): x for x in await lag_watch.measure()}
    finally:
        await lag_watch.close()
    behind = lags[(sink, "fleet.telemetry.samples")]
    assert (behind.role, behind.records, behind.since) == ("sink", 3, pytest.approx(sent_at + 2, abs=0.01))
    assert 115 < behind.lag_s < 150
    quiet = lags[(streams, "fleet.telemetry.samples")]
    assert (quiet.role, quiet.records, quiet.lag_s) == ("streams", 0, 0.0)

    stop = asyncio.Event()
    running = asyncio.create_task(watch(settings, stop))
    page_client = TestClient(TestServer(page.make_app(settings)))  # the page reads the alert topic, not the store
    await page_client.start_server()
    alerts = AIOKafkaConsumer(ALERTS.full(topic_prefix), bootstrap_servers=kafka_bootstrap,
                              auto_offset_reset="earliest")
    await alerts.start()
    try:
        seen = []

        async def until(status: str) -> dict:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for records in (await alerts.getmany(timeout_ms=500)).values():
                    seen.extend(orjson.loads(r.value) for r in records)
                mine = [a for a in seen if a["status"] == status]
                if mine:
                    return mine[0]
            raise AssertionError(f"no {status} alert in 30 s: {seen}")

        async def on_page(count: int) -> dict:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                shown = await (await page_client.get("/api/pipeline")).json()
                if shown["read_at"] is not None and len(shown["alerts"]) == count:
                    return shown
                await asyncio.sleep(0.2)
            raise AssertionError(f"the page did not show {count} pipeline alerts in 30 s: {shown}")

        fired = await until("firing")
        assert (fired["alertname"], fired["labels"]["group"], fired["labels"]["role"]) == (ALERTNAME, sink, "sink")
        shown = await on_page(1)
        assert shown["alerts"][0]["fingerprint"] == fired["fingerprint"] and shown["error"] is None
        await _commit(kafka_bootstrap, sink, tp, 5)  # the sink catches up
        resolved = await until("resolved")
        assert resolved["fingerprint"] == fired["fingerprint"]
        assert [a["labels"]["group"] for a in seen] == [sink, sink]  # the caught-up worker never fired
        await on_page(0)
        scraped = await (await page_client.get("/metrics")).text()
        assert 'fleetpulse_page_received_total{route="/api/pipeline"}' in scraped
    finally:
        stop.set()
        await running
        await alerts.stop()
        await page_client.close()


@pytest.mark.integration
async def test_a_partition_whose_committed_offset_does_not_move_while_records_wait_is_stalled_for_that_long(
        kafka_bootstrap, topic_prefix):
    """Measured on the real broker with the watch's clock moved by hand: records wait on a partition the sink's group
    last committed at 2; unmoved 40 s later it has been stalled 40 s; once it commits (even without catching up) it
    is not stalled; a group caught up is never stalled."""
    client = {"bootstrap_servers": kafka_bootstrap}
    await ensure_topics(client, prefix=topic_prefix)
    tp = TopicPartition(SAMPLES.full(topic_prefix), 1)
    producer = AIOKafkaProducer(**client)
    await producer.start()
    try:
        for _ in range(6):
            await producer.send_and_wait(tp.topic, b"{}", key=b"h", partition=1)
    finally:
        await producer.stop()
    sink, streams = f"{topic_prefix}fleetpulse-sink", f"{topic_prefix}fleetpulse-streams"
    await _commit(kafka_bootstrap, sink, tp, 2)
    await _commit(kafka_bootstrap, streams, tp, 6)
    now = [time.time() + 1]
    lag_watch = LagWatch(load(WatchSettings, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix),
                         clock=lambda: now[0])
    await lag_watch.start()
    try:
        async def measure() -> dict[str, GroupLag]:
            return {x.group: x for x in await lag_watch.measure() if x.topic == SAMPLES.name}

        first = await measure()
        assert (first[sink].records, first[sink].stalled_s, first[sink].stalled) == (4, 0.0, 0)  # first seen now
        now[0] += 40
        unmoved = await measure()
        assert (unmoved[sink].stalled, unmoved[sink].stalled_s) == (1, pytest.approx(40, abs=0.1))
        assert (unmoved[streams].records, unmoved[streams].stalled_s) == (0, 0.0)
        await _commit(kafka_bootstrap, sink, tp, 3)
        now[0] += 10
        moved = await measure()
        assert (moved[sink].records, moved[sink].stalled_s, moved[sink].stalled) == (3, 0.0, 0)
    finally:
        await lag_watch.close()


def test_the_page_feed_keeps_what_fires_of_the_pipeline_and_the_fleet_and_nothing_else():
    feed = AlertFeed(CommonSettings())
    alert = {"alertname": "FleetSilent", "status": "firing", "fingerprint": "f1", "starts_at": T0, "summary": "s"}
    feed.take(alert)
    feed.take({**alert, "alertname": "GpuOverheat", "fingerprint": "f2"})  # the store's panels show the others
    feed.take({**alert, "alertname": ALERTNAME, "fingerprint": "f3", "starts_at": T0 - 5})
    assert [a["fingerprint"] for a in feed.state()["alerts"]] == ["f3", "f1"]
    feed.take({**alert, "status": "resolved"})
    assert [a["alertname"] for a in feed.state()["alerts"]] == [ALERTNAME]
