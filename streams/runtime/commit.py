"""The at-least-once protocol of one batch, in one function and in order (as quix-streams' Checkpoint.commit):

1. `outputs_acknowledged`: every record the batch's steps handed the producer (alerts, drains, scores, dead letters)
   acknowledged by the broker;
2. `changelog_sent`: the batch's state changes handed to the producer, to each stage's changelog topic;
3. `changelog_acknowledged`: those acknowledged too, so the state the batch moved is durable;
4. `records_acknowledged`: the batch's records acknowledged to the consumer, so they may be committed; faust's commit
   loop commits every acknowledged offset within FLEETPULSE_STREAMS_COMMIT_INTERVAL_S.

Killed before step 4, the worker leaves the batch uncommitted and the next one reads it again: killed before 3, on
the state as it was before the batch (its outputs go out again, with the same ids, for their readers to deduplicate:
alert fingerprints, fault and drain ids); from 3 on, on the state the batch left, which says what it already did (an
alert fired, a fault counted), so nothing is done twice. Killed after step 4 and before the commit loop's next turn,
the same. tests/streams/test_commit_kills.py kills the worker after each step on the real broker and counts what came
out."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from streams.emit import Emitter
from streams.faust_adapter.tables import Changelog

if TYPE_CHECKING:
    from streams.runtime.lane import Stepped


async def commit(stepped: Stepped, emitter: Emitter, acknowledge: Callable[[], None],
                 changelog: list[Changelog] | None = None) -> None:
    """Steps 1-4 for a stepped batch. `changelog`: its state's changelog records, flushed into the tables in memory
    already (a lane that steps the next batch while this one is written); None, flushed here once the outputs are
    acknowledged, and rolled back should they fail. Whatever fails raises, and the records are not acknowledged."""
    try:
        await outputs_acknowledged(stepped.pending)
    except BaseException:
        if changelog is None:  # the state the batch moved goes back to its last durable value, as a restart finds it
            stepped.roll_back()
        raise
    if changelog is None:
        changelog = stepped.flush()
    await changelog_acknowledged(await changelog_sent(emitter, changelog))
    records_acknowledged(acknowledge)


async def outputs_acknowledged(pending: Sequence[Awaitable]) -> None:
    await asyncio.gather(*pending)


async def changelog_sent(emitter: Emitter, changelog: Sequence[Changelog]) -> list[Awaitable]:
    return [await emitter.send(c.topic, c.key, c.value, partition=c.partition) for c in changelog]


async def changelog_acknowledged(sent: Sequence[Awaitable]) -> None:
    await asyncio.gather(*sent)


def records_acknowledged(acknowledge: Callable[[], None]) -> None:
    acknowledge()
