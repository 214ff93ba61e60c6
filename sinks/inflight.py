"""The batch a sink was inserting when it stopped, read again from Kafka so it can be stored again whole.

ClickHouse writes an insert's part and the parts of the views it feeds (the watermark view, the rollups) one after
another, not as one. A sink killed between them leaves the raw rows stored and a view without them, or the watermark
ahead of a rollup; reading on from the watermark would then lose the rollup's share, and reading on from Kafka's last
commit would form other batches, with other tokens, and store the raw rows twice. So the sink records each batch's
topic, token and offset ranges before inserting it (sink_inflight), and at start-up inserts the last one of each topic
again, with the same records and the same token: every part that was written is a deduplicated no-op, every part that
was not is written now.
"""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition


async def read_ranges(kafka_args: dict, topic: str, ranges: dict[int, list[int]],
                      timeout_s: float = 30.0) -> list | None:
    """The records of `topic` at offsets `ranges` ({partition: [first, last]}), in offset order per partition; None
    when they are not all there (removed by retention, or the topic recreated shorter) or not read within
    `timeout_s`."""
    consumer = AIOKafkaConsumer(**kafka_args, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        parts = {TopicPartition(topic, p): (a, b) for p, (a, b) in ranges.items()}
        consumer.assign(list(parts))
        starts, ends = await consumer.beginning_offsets(list(parts)), await consumer.end_offsets(list(parts))
        if any(starts[tp] > a or ends[tp] <= b for tp, (a, b) in parts.items()):
            return None
        for tp, (a, _) in parts.items():
            consumer.seek(tp, a)
        out, pending, deadline = [], set(parts), time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            fetched = await consumer.getmany(*pending, timeout_ms=200)
            for tp, records in fetched.items():
                a, b = parts[tp]
                out += [r for r in records if a <= r.offset <= b]
            for tp in list(pending):  # the position, not the last record: a compacted log has gaps
                if await consumer.position(tp) > parts[tp][1]:
                    pending.discard(tp)
                    consumer.pause(tp)
        return None if pending else out
    finally:
        await consumer.stop()
