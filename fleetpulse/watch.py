"""`fleetpulse watch`: the pipeline watches itself. For every consumer group of the deployment (the stream workers,
the sink, the bots: whoever commits offsets on the deployment's topics) and each topic it reads, how far behind it
is: records not yet committed, and their age, now less the Kafka timestamp of the oldest record the group has not
committed (the one at its committed offset). A consumer cannot report its own lag once it is stopped or stuck; this
reads it from the broker, the same way for every role.

A group fires one `PipelineLagging` on the alert topic (severity critical; labels group, role, why, its worst topic
and every topic it trails on; its records and age as evidence) for either of two reasons:
- behind: its lag on a topic passes `watch_lag_s` (60 s), a consumer too slow for what it is sent;
- stalled: on some partition records have waited `watch_stall_s` (30 s) while its committed offset did not move, a
  consumer stopped, stuck or gone (seen before its lag reaches the threshold: a stopped sink within ~40 s).
It is resolved once its lag is back under half the threshold and nothing has waited unmoved for half the stall time,
or once the group is gone. A fleet that sends nothing leaves every group caught up: no lag, no alert (the silence
stage's FleetSilent says the fleet is quiet); a pipeline that stops while the fleet sends shows here, which role and
since when. The lags are served as Prometheus gauges (FLEETPULSE_WATCH_METRICS_PORT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from pydantic import Field, field_validator

from agents.publisher import Publisher
from core.errors import ConfigError
from core.metrics import MetricSpec, own, shared
from core.settings import CommonSettings, load
from schemas.analytics import Alert, fingerprint
from schemas.topics import ALERTS, INTERNAL, TOPICS
from streams.groups import APP_ID

ALERTNAME = "PipelineLagging"
log = logging.getLogger("fleetpulse.watch")


class WatchSettings(CommonSettings):
    """FLEETPULSE_WATCH_*; the rest is shared with every process."""

    watch_lag_s: float = Field(default=60.0, gt=0, description="a consumer group this far behind on a topic (the "
                               "age of its oldest record not committed) raises PipelineLagging")
    watch_stall_s: float = Field(default=30.0, gt=0, description="records waiting this long on a partition whose "
                                 "committed offset has not moved (a consumer stopped or stuck) raise PipelineLagging")
    watch_interval_s: float = Field(default=10.0, gt=0, le=3600, description="how often the groups are measured")
    watch_metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Prometheus /metrics of the "
                                           "groups' lags (e.g. 9467); empty or off: none")
    watch_metrics_addr: str = Field(default="0.0.0.0", description="address the watch's /metrics listens on")

    @field_validator("watch_metrics_port", mode="before")
    @classmethod
    def _off(cls, value):
        return None if value in ("", "off", "none") else value


@dataclass(frozen=True)
class GroupLag:
    """One consumer group on one topic: records it has not committed and the age of the oldest of them."""

    group: str
    role: str
    topic: str  # the registry's name (no prefix); an internal topic by its own name
    records: int
    lag_s: float  # 0 when caught up
    since: float | None = None  # the Kafka timestamp of the oldest record not committed
    stalled_s: float = 0.0  # the longest any partition's records have waited with its committed offset unmoved
    stalled: int = 0  # partitions where records wait and the committed offset has not moved since the last round


def role_of(group: str, prefix: str) -> str:
    """Which role a consumer group is: the stream worker's, the sink's or a bot's (else the group's own name)."""
    rest = group[len(prefix):] if group.startswith(prefix) else group
    if rest.startswith(APP_ID):
        return "streams"
    if "sink" in rest:
        return "sink"
    return "bot" if rest.startswith("fleetpulse-bot-") else rest


def our_topics(prefix: str) -> dict[str, str]:
    """Topic name on the cluster -> the registry's name, for every public and internal topic of the deployment."""
    out = {t.full(prefix): t.name for t in TOPICS.values()}
    out.update({t.full(prefix + APP_ID): t.name for t in INTERNAL.values()})
    return out


class LagWatch:
    """Measures every group's lag on the deployment's topics with one admin client and one group-less consumer."""

    def __init__(self, settings: CommonSettings, clock: Callable[[], float] = time.time):
        self.settings, self.clock = settings, clock
        self.topics = our_topics(settings.topic_prefix)
        client = settings.kafka_client_args()
        self.admin = AIOKafkaAdminClient(**client)
        # It reads one record per partition behind (its timestamp): small fetches, or it holds a megabyte per
        # partition (430 MB resident at 12,500 hosts with the pipeline behind, bench/fleet_scale.py). The broker still
        # returns a whole first batch, however large.
        self.reader = AIOKafkaConsumer(**client, enable_auto_commit=False, auto_offset_reset="earliest",
                                       max_partition_fetch_bytes=16 << 10, fetch_max_bytes=1 << 20)
        # (group, partition) -> its committed offset and when it was first seen there: how long it has not moved
        self.moved: dict[tuple[str, TopicPartition], tuple[int, float]] = {}

    async def start(self) -> None:
        """Connect both clients; on a broker that does not answer, close what was opened and raise."""
        try:
            await self.admin.start()
            await self.reader.start()
        except Exception:
            await self.close()
            raise

    async def close(self) -> None:
        await self.reader.stop()
        await self.admin.close()

    async def measure(self) -> list[GroupLag]:
        """Every group's lag on every topic of ours it has committed on, worst first."""
        groups = sorted(g for g, _ in await self.admin.list_consumer_groups())
        committed: dict[str, dict[TopicPartition, int]] = {}
        for group in groups:
            offsets = await self.admin.list_consumer_group_offsets(group)
            mine = {tp: m.offset for tp, m in offsets.items() if tp.topic in self.topics}
            if mine:
                committed[group] = mine
        tps = sorted({tp for c in committed.values() for tp in c})
        if not tps:
            return []
        ends = await self.reader.end_offsets(tps)
        begins = await self.reader.beginning_offsets(tps)
        behind = {(g, tp): max(off, begins[tp]) for g, c in committed.items() for tp, off in c.items()
                  if max(off, begins[tp]) < ends[tp]}
        stamps = await self._timestamps({(tp, off) for (_, tp), off in behind.items()})
        now, out = self.clock(), {}
        moved = {(g, tp): (off, self.moved[(g, tp)][1] if self.moved.get((g, tp), (None,))[0] == off else now)
                 for g, c in committed.items() for tp, off in c.items()}
        self.moved = moved  # a group or partition gone is forgotten
        for group, c in committed.items():
            for tp in c:
                key = (group, self.topics[tp.topic])
                records, since, stalled_s, stalled = out.get(key, (0, None, 0.0, 0))
                at = behind.get((group, tp))
                if at is not None:
                    records += ends[tp] - at
                    ts = stamps.get((tp, at))
                    since = ts if since is None or (ts is not None and ts < since) else since
                    unmoved_since = moved[(group, tp)][1]
                    if unmoved_since < now:  # not moved since the last round: its records wait on it
                        stalled += 1
                        stalled_s = max(stalled_s, now - max(unmoved_since, ts if ts is not None else now))
                out[key] = (records, since, stalled_s, stalled)
        lags = [GroupLag(g, role_of(g, self.settings.topic_prefix), t, n,
                         round(max(0.0, now - since), 1) if since is not None else 0.0, since,
                         round(stalled_s, 1), stalled)
                for (g, t), (n, since, stalled_s, stalled) in out.items()]
        return sorted(lags, key=lambda x: (-x.lag_s, -x.records, x.group, x.topic))

    async def _timestamps(self, wanted: set[tuple[TopicPartition, int]], timeout_s: float = 5.0) -> dict:
        """(partition, offset) -> the Kafka timestamp (s) of the record at that offset (or the first after it, on a
        compacted topic). Groups at different offsets of one partition are read in rounds, one record each: the
        consumer hands out one record at a time (max_records=1), so of each fetched batch only its first record is
        made into an object (without it every record fetched was: 452,319 a round to read 424 timestamps, four groups
        behind on 106 partitions); what is left of the fetches is dropped at the next assignment."""
        found: dict[tuple[TopicPartition, int], float] = {}
        left = set(wanted)
        while left:
            layer: dict[TopicPartition, int] = {}
            for tp, off in sorted(left, key=lambda x: x[1]):
                layer.setdefault(tp, off)
            left -= set(layer.items())
            self.reader.assign(list(layer))
            for tp, off in layer.items():
                self.reader.seek(tp, off)
            missing, deadline = set(layer), time.monotonic() + timeout_s
            while missing and time.monotonic() < deadline:
                for tp, records in (await self.reader.getmany(*missing, timeout_ms=200, max_records=1)).items():
                    if records and tp in missing:
                        found[(tp, layer[tp])] = records[0].timestamp / 1000.0
                        missing.discard(tp)
                        self.reader.pause(tp)
        self.reader.assign([])
        return found


@dataclass
class LagAlerts:
    """Which consumer groups are lagging (by their worst topic): one alert per group, fired once its lag passes
    `threshold_s` or its records wait unmoved for `stall_s`, resolved once both are under half of theirs, or when the
    group no longer commits on any of the deployment's topics."""

    threshold_s: float
    stall_s: float = 30.0
    firing: dict[str, float] = field(default_factory=dict)  # group -> starts_at

    def judge(self, lags: list[GroupLag], now: float) -> list[Alert]:
        by_group: dict[str, list[GroupLag]] = {}
        for lag in sorted(lags, key=lambda x: -x.lag_s):
            by_group.setdefault(lag.group, []).append(lag)
        out = []
        for group, mine in by_group.items():
            worst, stalled_s = mine[0], max(x.stalled_s for x in mine)
            if group not in self.firing and (worst.lag_s > self.threshold_s or stalled_s > self.stall_s):
                self.firing[group] = worst.since or now
                out.append(self._alert(mine, "firing", now))
            elif group in self.firing and worst.lag_s <= self.threshold_s / 2 and stalled_s <= self.stall_s / 2:
                out.append(self._alert(mine, "resolved", now))
                del self.firing[group]
        for group in [g for g in self.firing if g not in by_group]:
            out.append(self._alert([GroupLag(group, "", "", 0, 0.0)], "resolved", now))
            del self.firing[group]
        return out

    def _alert(self, mine: list[GroupLag], status: str, now: float) -> Alert:
        worst, stuck = mine[0], max(mine, key=lambda x: x.stalled_s)
        behind = [x for x in mine if x.records]
        why = "behind" if worst.lag_s > self.threshold_s or stuck.stalled_s <= self.stall_s else "stalled"
        waiting = f"{sum(x.records for x in behind):,} records not yet taken on {len(behind)} topics"
        if status == "resolved":
            summary = f"consumer group {worst.group} caught up (within {self.threshold_s / 2:g} s)"
        elif why == "behind":
            summary = (f"the {worst.role} (consumer group {worst.group}) is {worst.lag_s:,.0f} s behind: {waiting}, "
                       f"the oldest on {worst.topic} published at {worst.since:.0f}; its outputs (alerts, drains, "
                       "stored rows) are that late")
        else:
            summary = (f"the {worst.role} (consumer group {worst.group}) has committed nothing for "
                       f"{stuck.stalled_s:,.0f} s on {sum(x.stalled for x in mine)} partitions while records wait "
                       f"({waiting}, {worst.lag_s:,.0f} s behind): stopped, stuck or gone")
        value, threshold = (worst.lag_s, self.threshold_s) if why == "behind" else (stuck.stalled_s, self.stall_s)
        return Alert(fingerprint=fingerprint(f"{ALERTNAME}|group={worst.group}"), status=status,
                     alertname=ALERTNAME, severity="critical", ts=now, starts_at=self.firing.get(worst.group, now),
                     ends_at=now if status == "resolved" else None, value=value, threshold=threshold,
                     summary=summary[:1000], labels={"group": worst.group, "role": worst.role, "why": why,
                                                     "topic": worst.topic if why == "behind" else stuck.topic,
                                                     "topics": ",".join(x.topic for x in behind)[:500]},
                     evidence={"records": float(sum(x.records for x in behind)), "lag_s": worst.lag_s,
                               "stalled_s": stuck.stalled_s, "topics_behind": float(len(behind))})


GROUP = ["group", "role", "topic"]
LAG = shared("pipeline", "lag_seconds", "age of the oldest record the group has not committed on the topic (0: "
             "caught up), read from the broker", GROUP)
LAG_RECORDS = own("pipeline", "lag_records", "gauge", "records the group has not committed", GROUP)
STALLED = own("pipeline", "stalled_seconds", "gauge", "the longest the group's records on the topic have waited "
              "with its committed offset unmoved (0: it moves, or nothing waits)", GROUP)
LAGGING = own("pipeline", "lagging", "gauge", "1 while PipelineLagging fires for the group", GROUP)
CATALOGUE: tuple[MetricSpec, ...] = (LAG, LAG_RECORDS, STALLED, LAGGING)


class WatchMetrics(Collector):
    """The latest measurement, read at scrape time."""

    def __init__(self):
        self.lags: list[GroupLag] = []
        self.firing: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        lags = [([x.group, x.role, x.topic], x) for x in self.lags]
        yield LAG.of((key, x.lag_s) for key, x in lags)
        yield LAG_RECORDS.of((key, x.records) for key, x in lags)
        yield STALLED.of((key, x.stalled_s) for key, x in lags)
        yield LAGGING.of((key, int(x.group in self.firing)) for key, x in lags)


async def watch(settings: WatchSettings, stop: asyncio.Event, metrics: WatchMetrics | None = None) -> None:
    """Measure every `watch_interval_s` and publish what fires or resolves until `stop` is set. A broker away, at
    start or later, is waited out: each round connects what is not connected yet and measures again."""
    alerts, lag_watch, pub = LagAlerts(settings.watch_lag_s, settings.watch_stall_s), None, None
    try:
        while not stop.is_set():
            try:
                if lag_watch is None:
                    connecting = LagWatch(settings)
                    await connecting.start()
                    lag_watch = connecting
                if pub is None:
                    publisher = Publisher(settings, client_id="fleetpulse-watch")
                    await publisher.start()
                    pub = publisher
                lags = await lag_watch.measure()
                for alert in alerts.judge(lags, time.time()):
                    log.warning("%s %s: %s", alert.alertname, alert.status, alert.summary)
                    await pub.send(ALERTS, alert.model_dump(mode="json"))
                await pub.flush()
                if metrics is not None:
                    metrics.lags, metrics.firing = lags, set(alerts.firing)
            except Exception as exc:  # noqa: BLE001 - the broker away or restarting: measure again next round
                log.warning("could not measure the groups' lag (%s: %s); again in %g s", type(exc).__name__, exc,
                            settings.watch_interval_s)
            try:
                await asyncio.wait_for(stop.wait(), settings.watch_interval_s)
            except asyncio.TimeoutError:
                pass
    finally:
        if lag_watch is not None:
            await lag_watch.close()
        if pub is not None:
            await pub.close()


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="measure once, print every group's lag as JSON, and exit")


async def _once(settings: WatchSettings) -> list[dict]:
    lag_watch = LagWatch(settings)
    await lag_watch.start()
    try:
        return [asdict(lag) for lag in await lag_watch.measure()]
    finally:
        await lag_watch.close()


def run(args: argparse.Namespace) -> int:
    settings = load(WatchSettings)
    if args.once:
        print(json.dumps(asyncio.run(_once(settings)), indent=2))
        return 0
    metrics = WatchMetrics()
    if settings.watch_metrics_port is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics)
        try:
            start_http_server(settings.watch_metrics_port, settings.watch_metrics_addr, registry=registry)
        except OSError as exc:
            raise ConfigError(f"FLEETPULSE_WATCH_METRICS_PORT {settings.watch_metrics_port}: {exc.strerror}; choose a "
                              "free port, or `off`") from None

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await watch(settings, stop, metrics)
    asyncio.run(main())
    return 0
