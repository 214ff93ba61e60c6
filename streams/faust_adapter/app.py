"""Builds the faust app: broker and security from settings, raw values, memory tables with Kafka changelogs, stages
wired into lanes (streams/runtime/lane.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.sensors import Monitor
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from core.errors import ConfigError
from core.settings import CommonSettings
from streams import registry
from streams.emit import Emitter
from streams.faust_adapter import delivery
from streams.faust_adapter.offsets import GapWatch, RewindingConsumer, watch_offset_gaps
from streams.faust_adapter.producer import IdempotentProducer, TopicEmitter
from streams.faust_adapter.supervisor import LaneSupervisor
from streams.groups import app_id, group_id
from streams.metrics import MetricsRegistry
from streams.runtime.lane import Lane, Wired
from streams.runtime.spec import StageSpec, stage_logger
from streams.settings import StreamsSettings, streams_settings

log = logging.getLogger("fleetpulse.streams")


@dataclass
class StreamsRuntime:
    """What fleetpulse hangs on the app (`app.fleetpulse`): settings, the stages wired, their counters and agents."""

    settings: StreamsSettings
    stages: list[StageSpec]
    metrics: MetricsRegistry
    emitter: Emitter
    agents: dict[str, list]  # stage name -> the faust agents of its lanes
    worker: str = registry.WORKERS[0]
    lanes: list[Lane] = field(default_factory=list)
    gaps: GapWatch | None = None  # re-reads a partition whose commits faust stopped (streams/faust_adapter/offsets.py)


def _namespaced_table(namespace: str) -> type[faust.Table]:
    """faust names changelogs after the app id; ours keep the namespace's name, so a table's changelog is the same
    topic whichever worker (consumer group) runs its stage."""

    class NamespacedTable(faust.Table):
        def _changelog_topic_name(self) -> str:
            return f"{namespace}-{self.name}-changelog"

    return NamespacedTable


class QuietMonitor(Monitor):
    """faust's Monitor without its per-record bookkeeping. faust calls every sensor four times per record (received,
    into a stream, out of it, acknowledged); the Monitor's counters there feed only faust's web statistics pages, and
    the stages count what they receive, emit and refuse themselves (streams/metrics.py). Rebalance, commit and table
    hooks stay as faust's (faust warns when a rebalance finds no sensor state)."""

    def on_message_in(self, tp, offset, message) -> None:
        pass

    def on_stream_event_in(self, tp, offset, stream, event) -> None:
        return None

    def on_stream_event_out(self, tp, offset, stream, event, state=None) -> None:
        pass

    def on_message_out(self, tp, offset, message) -> None:
        pass


def broker_credentials(s: CommonSettings) -> faust.auth.Credentials | None:
    """Map the shared Kafka security settings onto faust credentials (PLAINTEXT: none)."""
    proto = s.kafka_security_protocol
    if proto == "PLAINTEXT":
        return None
    context = s.kafka_ssl_context()  # the same CA, client certificate and key as the agent and the sink
    if proto == "SSL":
        return faust.SSLCredentials(context)
    password = s.kafka_sasl_password.get_secret_value() if s.kafka_sasl_password else None
    return faust.SASLCredentials(username=s.kafka_sasl_username, password=password, ssl_context=context,
                                 mechanism=s.kafka_sasl_mechanism or "PLAIN")


def default_workdir(settings: CommonSettings, workdir: Path | None = None) -> Path:
    """The worker's faust data directory: `workdir` when given, else <data_dir>/streams."""
    return Path(workdir or settings.data_dir / "streams")


def create_app(settings: CommonSettings | None = None, *, stages: list[str] | None = None, worker: str | None = None,
               workdir: Path | None = None, emitter: Emitter | None = None) -> faust.App:
    """A faust app running `stages` (default: settings.stages, else every registered stage) of one worker.

    The chosen stages must all run in one worker (registry.WORKERS), or `worker` picks its share of them; streams.cli
    starts one process per worker. Processes of the same worker and settings share one consumer group: scale =
    partitions. `emitter` replaces the Kafka producer path (tests use streams.emit.MemoryEmitter).
    """
    s = streams_settings(settings)
    chosen = registry.select(stages if stages is not None else s.stages)
    by_worker = registry.workers(chosen)
    if worker is None and len(by_worker) > 1:
        raise ConfigError(f"stages {[st.name for st in chosen]} run in workers {', '.join(by_worker)}: one app each "
                          "(streams.cli starts them all)")
    worker = worker or next(iter(by_worker))
    if worker not in by_worker:
        raise ConfigError(f"worker {worker!r} runs none of the stages {[st.name for st in chosen]}; workers: "
                          f"{', '.join(registry.WORKERS)}")
    chosen = by_worker[worker]
    partitions = {t.partitions for stage in chosen for t in stage.topics()}
    if len(partitions) != 1:
        raise ConfigError(f"stages {[st.name for st in chosen]} read topics of different partition counts {partitions}")
    datadir = default_workdir(s, workdir)
    datadir.mkdir(parents=True, exist_ok=True)  # faust creates only the last level itself
    namespace = app_id(s.topic_prefix)
    direct = delivery.install(s.streams_eager_delivery) and s.streams_direct_lanes
    faust_kafka.Transport.Producer = IdempotentProducer  # the transport builds the app's producer when first used
    faust_kafka.Transport.Consumer = RewindingConsumer  # and its consumer at start-up
    app = faust.App(
        group_id(s.topic_prefix, worker),
        Table=_namespaced_table(namespace),
        broker=[f"kafka://{hp.strip()}" for hp in s.bootstrap.split(",")],
        broker_credentials=broker_credentials(s),
        key_serializer="raw",
        value_serializer="raw",  # stages decode with schemas.codec: lean on the hot path
        store="memory://",  # tables live in memory and recover from their Kafka changelogs
        topic_partitions=partitions.pop(),  # changelog and internal topics co-partition with the inputs
        topic_replication_factor=s.replication,
        topic_disable_leader=True,  # no leader topic: no stage uses leader-only timers
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        broker_commit_interval=s.streams_commit_interval_s,
        broker_session_timeout=s.streams_session_timeout_s,  # faust's 60 s kept a killed worker's restart waiting
        web_enabled=s.streams_web_port is not None,
        web_port=s.streams_web_port or 6066,
        datadir=str(datadir),
        autodiscover=False,
        monitor=QuietMonitor(),
        agent_supervisor=LaneSupervisor,  # a lane restarted after a crash stops with the worker
    )
    metrics = MetricsRegistry()
    runtime = StreamsRuntime(s, chosen, metrics, emitter or TopicEmitter(app), {}, worker=worker)
    lanes: dict[str, list[Wired]] = {}
    for stage in chosen:
        for w in wired(app, stage, s, metrics):
            lanes.setdefault(w.step.lane, []).append(w)
    counted: set[str] = set()
    for name, stages in lanes.items():
        lane = Lane(name, stages, prefix=s.topic_prefix, app_id=namespace, emitter=runtime.emitter,
                    metrics=metrics, batch_max=s.streams_batch_max, counted=counted,
                    within_s=min([s.streams_batch_within_s] + [w for st in stages
                                                               if (w := st.step.batch_within_s(st.config)) is not None]))
        channel = app.topic(*lane.sources, key_serializer="raw", value_serializer="raw")
        agent = app.agent(channel, name=f"lane.{name}", concurrency=1)(lane.run)  # subscribes; tests feed it
        if direct:
            lane.take_direct(app, max(4 * lane.batch_max, app.conf.stream_buffer_maxsize))
        runtime.lanes.append(lane)
        for st in stages:
            runtime.agents.setdefault(st.spec.name, []).append(agent)
    app.fleetpulse = runtime
    runtime.gaps = watch_offset_gaps(app)

    @app.on_rebalance_complete.connect
    async def _ready(sender, **kwargs) -> None:
        assigned = sorted(f"{tp.topic}[{tp.partition}]" for tp in app.assignor.assigned_actives()
                          if tp.topic.startswith(s.topic_prefix))
        log.info("streams ready: worker=%s group=%s stages=%s active=%d partitions", worker, app.conf.id,
                 ",".join(st.name for st in chosen), len(assigned))

    return app


def changelog_configs(s: StreamsSettings) -> dict[str, str]:
    """Every table changelog's topic settings beside faust's compaction: segments that close (and so get compacted)
    after FLEETPULSE_STREAMS_CHANGELOG_SEGMENT_S. faust's memory store restores a table from the changelog's start on
    every start-up; the broker's cleaner never touches the open segment, which by Kafka's defaults stays open for 7
    days or 1 GiB: at 2,048 hosts the telemetry tables write ~10k records a minute (bench: `docs/kafka.md`)."""
    return {"segment.ms": str(round(s.streams_changelog_segment_s * 1000))}


def wired(app: faust.App, spec: StageSpec, s: StreamsSettings, metrics: MetricsRegistry) -> list[Wired]:
    """A runtime stage's steps with its config built (a malformed one stops start-up here) and its tables registered."""
    tables = {t.name: app.Table(f"{spec.name}-{t.name}", partitions=t.partitions, help=t.help,
                                extra_topic_configs=changelog_configs(s)) for t in spec.tables}
    config, m, log = spec.config(s), metrics.stage(spec.name), stage_logger(spec.name)
    live = {t.name: t.live for t in spec.tables if t.live is not None}
    durable: dict[tuple[str, str], bytes] = {}  # shared by the steps, as the tables are
    return [Wired(spec, step, config, tables, m, log, live=live, durable=durable) for step in spec.steps]


def stage_lag(app: faust.App) -> dict[str, int]:
    """Per runtime stage, the records on its inputs' partitions this worker holds and has not processed yet."""
    def highwater(topic: str, partition: int) -> int | None:
        try:
            return app.consumer.highwater(TP(topic, partition))
        except Exception:  # noqa: BLE001 - not assigned (any more), or the consumer is not started
            return None

    out: dict[str, int] = {}
    for lane in app.fleetpulse.lanes:
        out.update(lane.lag(highwater))
    return out


def metrics_of(app: faust.App) -> MetricsRegistry:
    """The per-stage counters of an app built by create_app."""
    return app.fleetpulse.metrics
