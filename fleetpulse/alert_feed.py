"""The alerts about the pipeline itself, read from the alert topic rather than the store, for the fleet page.

A lagging sink stores `PipelineLagging` as late as everything else it stores, so a page that read its alerts from the
store would learn the pipeline is behind only once it has caught up. The page's feed reads fleet.alerts itself (no
consumer group, from `lookback_s` ago) and keeps which of the watched alerts fire: `PipelineLagging` (fleetpulse
watch: a consumer group behind) beside `FleetSilent` (the silence stage: no samples from any host), which tells a
silent fleet from a silent pipeline. A broker that is away is waited out, and the page says it cannot read the topic.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from core.errors import BrokerError, DecodeError
from core.settings import CommonSettings
from schemas.topics import ALERTS

log = logging.getLogger("fleetpulse.page")
WATCHED = ("PipelineLagging", "FleetSilent")
LOOKBACK_S = 6 * 3600.0  # an alert fired longer ago than this and never resolved is not shown
STOP_S = 10.0  # the longest the page's shutdown waits for the feed


class AlertFeed:
    """Firing alerts named in WATCHED, by fingerprint, as the alert topic last told them."""

    def __init__(self, settings: CommonSettings, lookback_s: float = LOOKBACK_S, retry_s: float = 5.0):
        self.settings, self.lookback_s, self.retry_s = settings, lookback_s, retry_s
        self.firing: dict[str, dict] = {}
        self.error: str | None = None
        self.read_at: float | None = None  # wall time the topic was last read up to its end
        self._task: asyncio.Task | None = None
        self._stopping = False

    def state(self) -> dict:
        """What /api/pipeline answers: the firing alerts (oldest first) and whether the topic could be read."""
        return {"alerts": sorted(self.firing.values(), key=lambda a: a["starts_at"]), "error": self.error,
                "read_at": self.read_at, "watched": list(WATCHED)}

    def take(self, alert: dict) -> None:
        if alert["alertname"] not in WATCHED:
            return
        if alert["status"] == "firing":
            self.firing[alert["fingerprint"]] = alert
        else:
            self.firing.pop(alert["fingerprint"], None)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="page-alert-feed")

    async def stop(self) -> None:
        """Cancel the feed and wait for it, at most STOP_S; the loop also ends at its next turn. A page test's teardown
        once waited here for over 20 minutes (CI, 2026-12-07), its loop idle: a cancellation lost inside the client
        (before Python 3.12, asyncio.wait_for can drop one that meets its inner call's end) is the likely cause."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            _, pending = await asyncio.wait({self._task}, timeout=STOP_S)
            if pending:
                log.warning("the page's alert feed did not stop within %g s; leaving it", STOP_S)

    async def _run(self) -> None:
        while not self._stopping:
            consumer = AIOKafkaConsumer(**self.settings.kafka_client_args(), enable_auto_commit=False)
            try:
                await consumer.start()
                await self._follow(consumer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the broker is away or restarting: wait, say so on the page
                if self.error is None:
                    log.warning("the page cannot read %s (%s); trying again every %g s", ALERTS.name, exc,
                                self.retry_s)
                self.error = f"cannot read {ALERTS.name}: {type(exc).__name__}: {exc}"[:300]
            finally:
                await consumer.stop()
            await asyncio.sleep(self.retry_s)

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        topic = ALERTS.full(self.settings.topic_prefix)
        if topic not in await consumer.topics():
            raise BrokerError(f"topic {topic} does not exist yet")
        tps = [TopicPartition(topic, p) for p in range(ALERTS.partitions)]  # as schemas/provision.py makes it
        consumer.assign(tps)
        since = await consumer.offsets_for_times({tp: int((time.time() - self.lookback_s) * 1000) for tp in tps})
        ends = await consumer.end_offsets(tps)
        self.firing.clear()
        for tp in tps:
            at = since.get(tp)
            consumer.seek(tp, at.offset if at is not None else ends[tp])
        while not self._stopping:
            for _tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                for r in records:
                    try:
                        self.take(ALERTS.decode_keyed(r.key, r.value))
                    except DecodeError:
                        continue  # the sink dead-letters it
            self.error, self.read_at = None, time.time()
