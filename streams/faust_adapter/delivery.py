"""Hands each fetched record to faust's streams without faust's tasks and asyncio.wait per record, unless it must wait.

faust 0.15.3's fetch loop (`Consumer._drain_messages`) delivers every record through
`wait_first(callback(message), suspend_flow.wait())`: four tasks and an `asyncio.wait` per record, so that a delivery
that blocks (flow control during a rebalance, a full stream queue, the producer's buffer, the conductor's lock) is
abandoned when the consumer's flow stops, stops or crashes. On the telemetry worker at 1,000 hosts that was ~30 % of
the process's CPU (`bench/throughput.py --stages all`: 13.7 s -> 9.8 s of CPU for 30,000 samples and 28,200 NCCL
steps).

This loop is faust's, record for record, except that it starts the delivery eagerly: it runs the callback's coroutine
in the fetch loop's own task up to its first wait. Almost always the record is in its streams' queues by then and the
coroutine has finished, with no task made. If it has to wait, the rest of it — the very wait it stopped at — goes to
faust's `wait_first` with the consumer's suspend-flow event, exactly as faust's loop would have, so whatever blocks a
delivery is abandoned on a rebalance, a stop or a crash as before. (An earlier version awaited the callback directly
whenever a check said it could not block, and could hold the fetch loop on a wait the check did not foresee: the
producer's buffer or the conductor's lock. The hang once blamed on it was a changelog topic missing from the group's
assignment on a fresh broker: streams/cli.py changelog_topics.) Reaches into faust's consumer (`_read_offset`): faust
is pinned (pyproject.toml), and a different version keeps its own loop.

A record of a lane's input topic does not take the conductor's path at all: it goes into the inboxes of the lanes that
read it (inbox.py), which take it in batches (FLEETPULSE_STREAMS_DIRECT_LANES; on by default).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any

import faust
from aiokafka.errors import IllegalStateError
from faust.transport import consumer as faust_consumer
from faust.transport.consumer import CONSUMER_FETCHING
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

log = logging.getLogger("fleetpulse.streams.runtime")
FAUST_VERSION = "0.15.3"  # the version whose `_drain_messages` this loop copies
FAUST_LOOP = faust_consumer.Consumer._drain_messages


class Resumed:
    """The rest of a coroutine that was started by hand and stopped at `waiting` (what it yielded to its task): awaiting
    this hands `waiting` to the awaiting task, then drives the coroutine on, passing in what the task sends or throws
    (a cancellation included) until it returns."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine, waiting: Any):
        self.coro, self.waiting = coro, waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self.coro, self.waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in by the task (CancelledError): the coroutine's
                try:
                    waiting = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                waiting = coro.send(sent)
            except StopIteration as done:
                return done.value


def start(coro: Coroutine) -> Resumed | None:
    """Run `coro` up to its first wait: None if it finished without one (its exceptions propagate), else the rest."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return Resumed(coro, waiting)


async def _drain_messages(self, fetcher) -> None:  # the fetch loop: every broker test, and test_offset_gaps.py
    callback = self.callback
    getmany = self.getmany
    consumer_should_stop = self._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    get_read_offset = self._read_offset.__getitem__
    set_read_offset = self._read_offset.__setitem__
    set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
    commit_every = self._commit_every
    acks_enabled_for = self.app.topics.acks_enabled_for
    routes = inboxes(self.app)  # topic -> the inboxes of the lanes that read it (streams/runtime/inbox.py)
    delivered = getattr(self, "delivered", None)  # partition -> the last offset handed out since the last seek
    rewound = getattr(self, "rewound", None)  # partition -> where this loop went back to, until a record comes
    if delivered is None or rewound is None:
        delivered, rewound = {}, {}
    since_yield = 0
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(CONSUMER_FETCHING)
            ait = getmany(timeout=1.0)
            await self.sleep(0)  # getmany may loop without giving the event loop a turn
            if not self.should_stop:
                rewinding: set = set()  # partitions sent back this fetch: the rest of their records here are early
                async for tp, message in ait:
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    if tp in rewinding:
                        continue
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        last = delivered.get(tp)
                        if (r_offset is not None and offset > r_offset and (offset > r_offset + 1 or last != r_offset)
                                and acks_enabled_for(message.topic)):  # not the record after the last: see jump
                            act = jump(offset, r_offset, last, rewound.get(tp))
                            if act is not None and act[0] == "again":
                                rewinding.add(tp)
                                await _read_again(self, tp, act[1], offset, rewound)
                                continue
                            if act is not None:
                                await self._add_gap(tp, act[1], offset - 1)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        lanes = routes.get(message.topic)
                        if lanes is not None:
                            await _hand_over(self, message, lanes)
                        else:
                            rest = start(callback(message))
                            if rest is not None:  # it waits: from here on as faust's loop does
                                await self.wait_first(rest, self.suspend_flow.wait())
                        set_read_offset(tp, offset)
                        delivered[tp] = offset
                        if rewound:
                            rewound.pop(tp, None)
                unset_flag(CONSUMER_FETCHING)
    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag(CONSUMER_FETCHING)


def jump(offset: int, read: int, delivered: int | None, rewound: int | None) -> tuple[str, int] | None:
    """What a record past faust's read offset of its partition (`read`) means: ("again", first) read the partition
    again from `first`; ("gap", first) faust's gap from `first` to the record (no records there); None: it is due.

    Right after a seek (`delivered`, the loop's last record handed out since the partition's last seek, is not
    `read`) the record due is `read` itself. A record past it means faust 0.15.3's getmany dropped records it had
    fetched around a rebalance (the group's generation changed, or the partition was not active yet) while the fetch
    position moved past them: they are read again, unless this is already the first fetch after reading again from
    there (`rewound`), when the broker has none. faust's own loop took such a jump for a compacted range and
    acknowledged the records in it unread: with `bench/throughput.py --workers 2` that committed 250-850 unprocessed
    samples per partition in three runs of four, and the same offsets, acknowledged again once read, left the
    partition committing a record or two per commit (seen with SIGUSR2's consumer report, streams/faust_adapter/report.py).
    Between seeks the record due is the one after `read`, and a jump is a compacted range or a transaction marker."""
    if offset <= read:
        return None
    if delivered != read:
        return ("gap", read) if rewound == read else ("again", read)
    return ("gap", read + 1) if offset > read + 1 else None


async def _read_again(consumer, tp, first: int, offset: int, rewound: dict) -> None:
    log.warning("%s[%d]: the fetch went on at offset %d, past %d..%d that were never handed out (dropped by faust "
                "around a rebalance): reading them again", tp.topic, tp.partition, offset, first, offset - 1)
    try:
        await consumer.seek(tp, first)
    except (IllegalStateError, AssertionError) as exc:  # revoked meanwhile: its next owner reads from the commit
        log.info("%s[%d] is no longer assigned (%r): not read again here", tp.topic, tp.partition, exc)
        return
    rewound[tp] = first


def inboxes(app) -> dict[str, tuple]:
    """Per input topic, the inboxes of the app's lanes that take records straight from this loop (none: faust's)."""
    runtime = getattr(app, "fleetpulse", None)
    out: dict[str, list] = {}
    for lane in getattr(runtime, "lanes", ()):
        if lane.inbox is not None:
            for topic in lane.sources:
                out.setdefault(topic, []).append(lane.inbox)
    return {topic: tuple(boxes) for topic, boxes in out.items()}


async def _hand_over(consumer, message, lanes: tuple) -> None:
    """Into each reading lane's inbox, as faust's conductor hands a record to its streams: while the app's flow is
    suspended it waits, and a lane's full inbox is waited for; either wait is abandoned if the consumer's flow stops
    meanwhile (a rebalance: faust reads the record again from the committed offset)."""
    flow = consumer.app.flow_control
    if not flow.is_active():
        await consumer.wait_first(flow.acquire(), consumer.suspend_flow.wait())
        if not consumer.flow_active:
            return
    message.incref(len(lanes))  # acknowledged to the consumer when every lane has acknowledged it
    for inbox in lanes:
        if inbox.full(message):
            await consumer.wait_first(inbox.room(message), consumer.suspend_flow.wait())
            if not consumer.flow_active:
                return
        inbox.put(message)


async def this_assignment(app, taken: list) -> list:
    """Of a batch a lane took from its inbox, the records it may process: after a rebalance that began meanwhile has
    ended, those fetched in the group's current generation (faust fetches the others again from the commit if the
    partition is still ours, and its streams skip them too; streams/faust_adapter/offsets.py re-reads a partition
    should faust not), each tracked as faust's streams track theirs (a rebalance waits until it is acknowledged)."""
    if not app.flow_control.is_active():
        await app.flow_control.acquire()
    generation = app.consumer_generation_id
    messages = [m for m in taken if m.generation_id == generation]
    unacked = app.consumer.unacked
    for m in messages:
        if not m.tracked:
            m.tracked = True
            unacked.add(m)
    return messages


async def batches(stream, batch_max: int, within_s: float) -> AsyncIterator[list]:
    """The batches of a lane's faust agent stream (FLEETPULSE_STREAMS_DIRECT_LANES=false, and faust's agent test
    contexts): faust acknowledges each batch's records as the stream moves past them."""
    async for events in stream.take_events(batch_max, within=within_s):
        yield [e.message for e in events]


def dropped(stream, messages) -> None:
    """A batch of the agent stream whose lane raised: abandoned (never committed), and marked acknowledged, for faust
    acknowledges them on its way out and that must not count them done."""
    consumer = getattr(getattr(stream, "app", None), "consumer", None)
    if consumer is not None:
        abandon(consumer, messages)
    for m in messages:
        m.acked = True


def acknowledge(consumer, messages) -> None:
    """`message.ack(consumer)` for each record of a lane's batch, under one lock: faust 0.15.3's Message.ack,
    ConsumerMessage.on_final_ack and Consumer.ack inlined (one at a time, with two lock round trips and a wake-up each,
    they cost the telemetry worker ~4 % of its CPU). Used with direct lanes, which need this module's fetch loop, so
    only on the pinned faust version."""
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    committed_at, acked_index, acked, unacked = (consumer._committed_offset, consumer._acked_index, consumer._acked,
                                                 consumer._unacked_messages)
    abandoned = getattr(consumer, "abandoned", ())
    n = 0
    with ack_lock:
        for m in messages:
            if m.acked:
                continue
            m.refcount = refcount = max(m.refcount - 1, 0)
            if refcount:  # another lane reads it too and has not acknowledged it yet
                continue
            if abandoned and m in abandoned:  # a lane that read it crashed: read again, not acknowledged
                unacked.discard(m)
                continue
            m.acked = True
            if not acks_enabled_for(m.topic):
                continue
            tp, offset = m.tp, m.offset
            committed = committed_at[tp]
            if committed is None or offset >= committed:
                index = acked_index[tp]
                if offset not in index:
                    unacked.discard(m)
                    index.add(offset)
                    acked[tp].append(offset)
                    n += 1
        consumer._n_acked += n
    notify(consumer._waiting_for_ack)


def abandon(consumer, messages) -> dict:
    """The records of a lane's batch that raised: never acknowledged, so never committed, and no longer waited for
    (faust's stop waits until every tracked record is acknowledged, and these never will be: a worker stopping after
    its lane crashed hung there). A record another lane still holds is untracked when that lane is done with it
    (acknowledge). The consumer commits nothing of a partition from the first of them on (streams/faust_adapter/offsets.py):
    faust alone would commit past one at its committed offset, or any on a partition never committed, once later
    records of it are acknowledged (by another lane). Returns that first offset per partition."""
    unacked, first = consumer._unacked_messages, {}
    abandoned = getattr(consumer, "abandoned", None)
    with ack_lock:
        for m in messages:
            if m.acked:
                continue
            first[m.tp] = min(m.offset, first.get(m.tp, m.offset))
            m.refcount = refcount = max(m.refcount - 1, 0)
            if refcount and abandoned is not None:
                abandoned.add(m)
            else:
                unacked.discard(m)
    hold = getattr(consumer, "hold", None)
    if hold is not None:
        for tp, offset in first.items():
            hold(tp, offset)
    return first


def install(eager: bool = True) -> bool:
    """The fetch loop of every faust consumer in this process: this one (`eager`), or faust's own. True if this one
    is in place; faust's is kept on another faust version."""
    if eager and faust.__version__ != FAUST_VERSION:
        log.warning("faust %s is not %s: keeping its own fetch loop (four tasks per record)", faust.__version__,
                    FAUST_VERSION)
        eager = False
    faust_consumer.Consumer._drain_messages = _drain_messages if eager else FAUST_LOOP
    return eager
