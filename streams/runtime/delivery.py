"""Hands each fetched record to faust's streams without two tasks and an asyncio.wait per record.

faust 0.15.3's fetch loop (`Consumer._drain_messages`) delivers every record through
`wait_first(callback(message), suspend_flow.wait())`: two tasks and an `asyncio.wait` per record, so that a delivery
blocked during a rebalance is abandoned. On the telemetry worker at 1,000 hosts that was ~30 % of the process's CPU
(`bench/throughput.py --stages all`: 13.7 s -> 9.8 s of CPU for the same 30,000 samples and 28,200 NCCL steps).

A delivery can only block when flow is suspended (a rebalance), or when a stream queue of the record's partition is
full (the conductor then waits for room). This loop is faust's, record for record, except that it awaits the delivery
directly when neither holds, and falls back to faust's `wait_first` when one does. Reaches into faust's consumer and
conductor (`_tp_index`, `_read_offset`): faust is pinned (pyproject.toml), and a different version keeps its own loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
from faust.transport import consumer as faust_consumer
from faust.transport.consumer import CONSUMER_FETCHING

log = logging.getLogger("fleetpulse.streams.runtime")
FAUST_VERSION = "0.15.3"  # the version whose `_drain_messages` this loop copies
FAUST_LOOP = faust_consumer.Consumer._drain_messages


def must_wait(suspended: bool, flow_active: bool, queues: Any) -> bool:
    """True when handing a record over may block: flow suspended (a rebalance) or a full stream queue."""
    return suspended or not flow_active or any(q.full() for q in queues)


async def _drain_messages(self, fetcher) -> None:  # pragma: no cover - the fetch loop; exercised by every broker test
    callback = self.callback
    getmany = self.getmany
    consumer_should_stop = self._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    get_read_offset = self._read_offset.__getitem__
    set_read_offset = self._read_offset.__setitem__
    set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
    commit_every = self._commit_every
    acks_enabled_for = self.app.topics.acks_enabled_for
    suspended = self.suspend_flow.is_set
    flow_active = self.app.flow_control.is_active
    channels_of = self.app.topics._tp_index.get
    since_yield = 0
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(CONSUMER_FETCHING)
            ait = getmany(timeout=1.0)
            await self.sleep(0)  # getmany may loop without giving the event loop a turn
            if not self.should_stop:
                async for tp, message in ait:
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):
                            await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        if must_wait(suspended(), flow_active(), [c.queue for c in channels_of(tp, ())]):
                            await self.wait_first(callback(message), self.suspend_flow.wait())
                        else:
                            await callback(message)
                        set_read_offset(tp, offset)
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


def install(direct: bool = True) -> bool:
    """The fetch loop of every faust consumer in this process: this one (`direct`), or faust's own. True if this one
    is in place; faust's is kept on another faust version."""
    if direct and faust.__version__ != FAUST_VERSION:
        log.warning("faust %s is not %s: keeping its own fetch loop (a task pair per record)", faust.__version__,
                    FAUST_VERSION)
        direct = False
    faust_consumer.Consumer._drain_messages = _drain_messages if direct else FAUST_LOOP
    return direct
