"""Where the sink resumes a partition: after the highest offset already stored (the `sink_watermarks` view of the data
rows themselves), even where Kafka's commit lags behind it; and what it does with a partition found recreated."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from sinks import store

if TYPE_CHECKING:
    from sinks.sink import ClickHouseSink

log = logging.getLogger("fleetpulse.sink")


class Rebalance(ConsumerRebalanceListener):
    def __init__(self, sink: ClickHouseSink):
        self.sink = sink

    async def on_partitions_revoked(self, revoked):
        self.sink.generation += 1  # what the main loop fetched before this is no longer its to take
        await self.sink.flush_all()

    async def on_partitions_assigned(self, assigned):
        # Paused until the sink has looked at them: the fetcher runs meanwhile, and records it returned before the
        # seek (or before a recreated partition's watermark is gone) would be judged against the wrong offsets.
        consumer = self.sink.consumer
        consumer.pause(*assigned)
        try:
            await seek_past_watermarks(self.sink, assigned)
        finally:
            consumer.resume(*assigned)


async def seek_past_watermarks(sink: ClickHouseSink, assigned) -> None:
    """Resume after the highest offset already stored, even where Kafka's commit lags behind it (the batch a sink
    stopped in is stored again at start, sinks/inflight.py), and commit that position: the rows are durable, and the
    group's lag would otherwise count them as unread until new records pass them. A partition that ends at or below
    that offset was recreated and is read as new (reset_recreated)."""
    marks = await sink.on_store_waiting("reading the watermarks", store.watermarks)
    await reset_recreated(sink, assigned, marks)
    sink.stored = marks
    behind: dict[TopicPartition, int] = {}
    for tp in assigned:
        stored = marks.get((tp.topic, tp.partition))
        if stored is None:
            continue
        committed = await sink.consumer.committed(tp)
        if committed is None or committed <= stored:
            sink.consumer.seek(tp, stored + 1)
            behind[tp] = stored + 1
            log.info("resuming %s[%d] at %d after stored rows", tp.topic, tp.partition, stored + 1)
    if behind:
        try:
            await sink.consumer.commit(behind)
        except KafkaError as exc:  # the store's watermark decides where to resume; the commit only shows it
            log.warning("could not commit the stored positions %s: %r", behind, exc)


async def reset_recreated(sink: ClickHouseSink, assigned, marks: dict[tuple[str, int], int]) -> None:
    """A partition whose log ends at or below the highest offset stored from it is not the one those rows came from
    (a topic deleted and made again, a wiped broker, a store moved to another cluster): its offsets began again, and
    skipping them as replays would lose every record. Its watermark goes (the reset is recorded in sink_topic_resets,
    with a warning) and the topic's insert tokens take a new epoch. A recreated topic that has already grown past the
    old watermark cannot be told apart by offsets (docs/architecture.md, the sink)."""
    held = [tp for tp in assigned if (tp.topic, tp.partition) in marks]
    if not held:
        return
    ends = await sink.consumer.end_offsets(held)
    for tp in held:
        stored, end = marks[(tp.topic, tp.partition)], ends.get(tp)
        if end is None or stored < end:
            continue
        await sink.on_store_waiting(f"resetting the watermark of {tp.topic}[{tp.partition}]", store.reset_watermark,
                                    tp.topic, tp.partition, stored, end, store.layout(sink.settings))
        del marks[(tp.topic, tp.partition)]
        batch = sink.batches[tp.topic]
        batch.epoch += 1
        sink.stats.tables[batch.table.name].topic_resets += 1
        log.warning("%s[%d] ends at offset %d but the store holds its rows up to offset %d: the topic was "
                    "recreated (or this store belongs to another cluster); its records are stored as new ones "
                    "(recorded in sink_topic_resets)", tp.topic, tp.partition, end, stored)
