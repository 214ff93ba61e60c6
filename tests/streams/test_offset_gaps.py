"""The offset-gap watchdog's decision: a stall that stays put over two checks is read again from the committed
offset; one that moves, a single missing record (faust commits past it) or a fully committed partition is left
alone. The stalls themselves come from faust around a rebalance: `fleetpulse evaluate --scenario llama3-mix
--kill-worker-at 900` and tests/streams/test_lifecycle_integration.py are where they show (docs/evaluation.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from streams.faust_adapter.delivery import jump
from streams.faust_adapter.offsets import GapWatch, RewindingConsumer, rewind_uncommitted, stall

SAMPLES = TP("fleet.telemetry.samples", 3)
OTHER = TP("fleet.telemetry.samples", 4)
CHANGELOG = TP("fleetpulse-streams-health-hosts-changelog", 3)  # read by table recovery, never acknowledged


class Consumer:
    """faust's consumer as GapWatch reads it: assignment, acknowledged offsets, committed offsets, seek."""

    def __init__(self):
        self._acked = {SAMPLES: [7600, 7601, 7602], OTHER: [10, 11]}
        self._committed_offset = {SAMPLES: 7522, OTHER: 10}
        self._read_offset = {SAMPLES: 7602, OTHER: 11, CHANGELOG: 40}
        self.ends = {SAMPLES: 7700, OTHER: 12, CHANGELOG: 41}
        self.seeks: list[tuple[TP, int]] = []

    def assignment(self):
        return {SAMPLES, OTHER, CHANGELOG}

    def highwater(self, tp: TP) -> int:
        return self.ends[tp]

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_what_counts_as_stuck():
    assert stall([7600, 7601], 7522, 7601, 7700) == (7522, 7600)  # head gap: 7522..7599 never acknowledged
    assert stall([7523, 7524], 7522, 7524, 7600) is None  # one record missing: faust commits past it
    assert stall([7522], 7522, 7522, 7600) is None and stall([5], None, 5, 9) is None  # acknowledged, commit due
    assert stall([], 2, 1, 2) is None and stall([], 2, 2, 2) is None  # all committed (or just sought), nothing past
    assert stall([], None, None, 4) == (0, 4)  # never handed out (stuck only if it stays so for two checks)
    assert stall([], None, None, None) is None and stall([], 3, None, 3) is None  # nothing there to read
    assert stall([], None, 1, 2) == (0, 2) and stall([], 5, 7, 8) == (5, 8)  # handed out, never acknowledged


async def test_a_gap_that_stays_is_read_again_once_and_a_moving_one_is_left_alone():
    consumer = Consumer()
    acking = SimpleNamespace(acks_enabled_for=lambda topic: not topic.endswith("-changelog"))
    watch = GapWatch(SimpleNamespace(consumer=consumer, topics=acking))
    await watch.check()
    assert consumer.seeks == []  # first sighting: the records may still arrive
    consumer._acked[SAMPLES].append(7603)
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)] and watch.mended == 1  # same head gap: read again from 7522
    # (the changelog partition looks stuck the same way, but only table recovery reads it: never sought)
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]  # seen again only after another full check
    consumer._committed_offset[SAMPLES] = 7530  # it moved: not stuck
    await watch.check()
    assert consumer.seeks == [(SAMPLES, 7522)]


@pytest.mark.integration
async def test_a_partition_with_nothing_committed_is_read_again_from_its_first_record(kafka_bootstrap, topic_prefix):
    """What faust's seek back to committed offsets leaves behind, on the real broker and client: records fetched,
    then dropped (faust's getmany around a rebalance), on a partition the group never committed. aiokafka's
    seek_to_committed leaves its position past them; rewind_uncommitted reads them again."""
    topic = f"{topic_prefix}rack_power"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, b"%d" % i, partition=0)
        await producer.send_and_wait(topic, b"committed", partition=1)
    finally:
        await producer.stop()
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}group",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp0, tp1])
        fetched = await _read(consumer, 6)  # fetched, then dropped as faust does: nothing processed
        assert sorted(r.value for r in fetched) == [b"0", b"1", b"2", b"3", b"4", b"committed"]
        await consumer.commit({tp1: 1})
        committed = await consumer.seek_to_committed()
        assert committed == {tp0: None, tp1: 1} and await consumer.position(tp0) == 5  # aiokafka alone: lost
        assert await rewind_uncommitted(consumer, committed, reads=lambda name: name == topic) == [tp0]
        assert await consumer.position(tp0) == 0 and await consumer.position(tp1) == 1
        assert [r.value for r in await _read(consumer, 5)] == [b"0", b"1", b"2", b"3", b"4"]
    finally:
        await consumer.stop()


async def _read(consumer, n: int) -> list:
    out = []
    for _ in range(50):
        for records in (await consumer.getmany(timeout_ms=200)).values():
            out += records
        if len(out) >= n:
            return out
    raise AssertionError(f"read {len(out)} of {n} records")


def test_the_worker_s_consumer_rewinds_uncommitted_partitions(tmp_path):
    from faust.transport.drivers import aiokafka as faust_kafka

    from streams.faust_adapter.app import create_app
    from streams.settings import streams_settings

    create_app(streams_settings(None), stages=["power_thermal"], workdir=tmp_path)
    assert faust_kafka.Transport.Consumer is RewindingConsumer


def test_a_crashed_batch_holds_its_partitions_commits_until_its_records_are_read_again(tmp_path):
    """delivery.abandon: a lane's batch that raised leaves its records unacknowledged and untracked; the consumer
    commits nothing past the first of them (faust alone commits past one at its committed offset, and past any on a
    partition never committed, once later records are acknowledged) until they are read again and acknowledged."""
    from faust.types.tuples import Message

    from core.settings import load
    from schemas.topics import SAMPLES
    from streams.faust_adapter.app import create_app
    from streams.faust_adapter.delivery import abandon, acknowledge
    from streams.settings import StreamsSettings

    app = create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path),
                     stages=["power_thermal"])
    consumer = app.consumer
    assert isinstance(consumer, RewindingConsumer)
    app.topics.acks_enabled_for = lambda topic: True  # the lanes' inputs once their streams subscribe (at start)

    def fetched(partition: int, *offsets: int, refcount: int = 1) -> list[Message]:
        out = [Message(SAMPLES.name, partition, o, 0.0, 0, None, b"h", b"{}", None, tp=TP(SAMPLES.name, partition))
               for o in offsets]
        for m in out:
            m.refcount, m.tracked = refcount, True
            consumer._unacked_messages.add(m)
        return out

    tp = TP(SAMPLES.name, 0)
    consumer._committed_offset[tp] = 10
    crashed = fetched(0, 10)
    assert abandon(consumer, crashed) == {tp: 10}
    assert not any(m in consumer._unacked_messages for m in crashed)  # a stop does not wait for them
    acknowledge(consumer, fetched(0, 11, 12))  # later records, done by another lane that reads the partition
    assert consumer._new_offset(tp) is None  # faust alone: 13, past offset 10
    acknowledge(consumer, fetched(0, 10, 11, 12))  # read again from the held offset
    assert consumer._new_offset(tp) == 13 and tp not in consumer.held

    fresh = TP(SAMPLES.name, 1)  # nothing committed yet
    abandon(consumer, fetched(1, 0, 1))
    acknowledge(consumer, fetched(1, 2, 3))
    assert consumer._new_offset(fresh) is None  # faust alone: 4
    consumer._committed_offset[fresh] = 5  # another member read and committed them meanwhile: the hold is moot
    consumer._new_offset(fresh)
    assert fresh not in consumer.held

    shared = TP(SAMPLES.name, 2)  # a record two lanes read: one crashed on it, the other finishes it later
    both = fetched(2, 0, refcount=2)
    abandon(consumer, both)
    assert both[0] in consumer._unacked_messages  # the other lane still holds it
    acknowledge(consumer, both)
    assert both[0] not in consumer._unacked_messages and not both[0].acked  # untracked, never acknowledged
    acknowledge(consumer, fetched(2, 1))  # a later record of the partition, done by its one lane
    assert consumer._new_offset(shared) is None and 0 not in consumer._acked_index[shared]  # faust alone: 2


def test_what_a_jump_past_the_read_offset_means():
    assert jump(23, 22, 22, None) is None and jump(22, 22, None, None) is None  # the one due next
    assert jump(275, 21, None, None) == ("again", 21)  # after a seek to 21 the fetch went on at 275: read again
    assert jump(22, 21, None, None) == ("again", 21)  # even one record: 21 is the seek's own
    assert jump(275, 21, 274, None) == ("again", 21)  # handed out 274 before the seek: 21 is due all the same
    assert jump(275, 21, None, 21) == ("gap", 21)  # the first fetch after reading again from 21: none there
    assert jump(35, 30, 30, None) == ("gap", 31)  # between seeks: a compacted range (fleet.node.state)
    assert jump(35, 30, 30, 12) == ("gap", 31)


class FetchingConsumer:
    """faust's consumer as the fetch loop (delivery._drain_messages) uses it, over scripted fetches: each getmany
    yields one list of (partition, offset); a seek takes effect from the next fetch, as aiokafka's drops prefetched
    records."""

    def __init__(self, fetches: list[list[int]], read: int):
        from streams.runtime.inbox import Inbox

        self.fetches, self.seeks, self.gaps = list(fetches), [], []
        self.inbox = Inbox(1000)
        lane = SimpleNamespace(inbox=self.inbox, sources=(SAMPLES.topic,))
        self.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
                                   fleetpulse=SimpleNamespace(lanes=[lane]),
                                   flow_control=SimpleNamespace(is_active=lambda: True))
        self._stopped = SimpleNamespace(is_set=lambda: not self.fetches)
        self._read_offset = {SAMPLES: read}
        self.delivered: dict = {}
        self.rewound: dict = {}
        self.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
        self._commit_every, self.should_stop, self.flow_active, self.consumer_stopped_errors = None, False, True, ()
        self.callback = None  # records of a lane's topic go to its inbox, not through faust's conductor

    async def sleep(self, seconds: float) -> None:
        pass

    async def getmany(self, timeout: float):
        from faust.types.tuples import Message

        fetch = self.fetches.pop(0)
        if callable(fetch):  # between fetches: a rebalance
            fetch()
            fetch = self.fetches.pop(0)
        for offset in fetch:
            yield SAMPLES, Message(SAMPLES.topic, SAMPLES.partition, offset, 0.0, 0, None, b"h", b"{}", None,
                                   tp=SAMPLES)

    async def seek(self, tp: TP, offset: int) -> None:  # RewindingConsumer's, on faust's
        self.seeks.append(offset)
        self._read_offset[tp] = offset
        self.delivered.pop(tp, None)
        self.rewound.pop(tp, None)

    def perform_seek(self, committed: int) -> None:  # RewindingConsumer's, on faust's (a rebalance)
        self._read_offset[SAMPLES] = committed
        self.delivered.clear()
        self.rewound.clear()

    async def _add_gap(self, tp: TP, first: int, last: int) -> None:
        self.gaps.append((first, last))


async def test_records_the_fetch_skipped_around_a_rebalance_are_read_again_in_order():
    """After a seek back to the committed offset 21 (a rebalance) the first fetch starts at 275: faust's getmany had
    dropped 21..274 while the position moved on. The loop goes back for them rather than take the jump for a
    compacted range (faust acknowledged the records in it unread); the records after the jump in that fetch wait
    for their turn."""
    from streams.faust_adapter.delivery import _drain_messages

    consumer = FetchingConsumer([[275, 276], list(range(21, 278))], read=21)
    await _drain_messages(consumer, SimpleNamespace(_stopped=SimpleNamespace(is_set=lambda: False)))
    assert consumer.seeks == [21] and consumer.gaps == []
    assert [m.offset for m in consumer.inbox.items] == list(range(21, 278))  # each once, in order

    # read again from 21 and it is still not there: the broker has no such records (faust's gap, 21..274)
    consumer = FetchingConsumer([[275], [275, 276]], read=21)
    await _drain_messages(consumer, SimpleNamespace(_stopped=SimpleNamespace(is_set=lambda: False)))
    assert consumer.seeks == [21] and consumer.gaps == [(21, 274)]
    assert [m.offset for m in consumer.inbox.items] == [275, 276]


async def test_a_second_rebalance_before_the_records_come_reads_them_again_too():
    """Workers joining one after another: faust seeks back to 21 again before the records read again arrive, and
    drops them again. That is a new seek, not the broker lacking the records (no gap), and 21.. still come in order."""
    from streams.faust_adapter.delivery import _drain_messages

    consumer = FetchingConsumer([[275]], read=21)
    consumer.fetches += [lambda: consumer.perform_seek(21), [300], list(range(21, 302))]
    await _drain_messages(consumer, SimpleNamespace(_stopped=SimpleNamespace(is_set=lambda: False)))
    assert consumer.seeks == [21, 21] and consumer.gaps == []
    assert [m.offset for m in consumer.inbox.items] == list(range(21, 302))


async def test_a_compacted_range_between_seeks_is_faust_s_gap():
    from streams.faust_adapter.delivery import _drain_messages

    consumer = FetchingConsumer([[21, 22, 30, 31]], read=21)
    await _drain_messages(consumer, SimpleNamespace(_stopped=SimpleNamespace(is_set=lambda: False)))
    assert consumer.seeks == [] and consumer.gaps == [(23, 29)]
    assert [m.offset for m in consumer.inbox.items] == [21, 22, 30, 31]
