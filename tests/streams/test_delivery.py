"""The eager hand-over of the fetch loop: a delivery that never waits runs in the loop's own task; one that waits is
handed on, from the very wait it stopped at, to faust's `wait_first` (abandoned when flow stops); and where it is on."""

from __future__ import annotations

import asyncio

import faust
import pytest
from faust.transport import consumer as faust_consumer
from mode import Service

from core.settings import load
from streams.faust_adapter.app import create_app
from streams.faust_adapter import delivery
from streams.settings import StreamsSettings


async def test_a_delivery_that_never_waits_finishes_in_the_callers_task_with_no_task_made():
    delivered, tasks_before = [], len(asyncio.all_tasks())

    async def callback(message):
        delivered.append((message, asyncio.current_task()))

    assert delivery.start(callback("m1")) is None
    assert delivered == [("m1", asyncio.current_task())]
    assert len(asyncio.all_tasks()) == tasks_before


async def test_a_delivery_that_waits_resumes_from_its_wait_with_what_it_is_sent():
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    queue.put_nowait("older")
    steps = []

    async def callback(message):
        steps.append("started")
        await queue.put(message)  # full: waits for room
        steps.append("put")
        await asyncio.sleep(0)  # a bare yield on the way
        return message

    rest = delivery.start(callback("m1"))
    assert rest is not None and steps == ["started"]
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0)
    assert not task.done()
    assert queue.get_nowait() == "older"  # room: the put completes, the coroutine goes on to its end
    assert await asyncio.wait_for(task, 1) == "m1"
    assert steps == ["started", "put"] and queue.get_nowait() == "m1"


async def test_exceptions_reach_the_fetch_loop_before_and_after_the_first_wait():
    async def at_once(message):
        raise ValueError(message)

    with pytest.raises(ValueError, match="early"):
        delivery.start(at_once("early"))

    gate = asyncio.Event()

    async def later(message):
        await gate.wait()
        raise ValueError(message)

    task = asyncio.ensure_future(delivery.start(later("late")))
    gate.set()
    with pytest.raises(ValueError, match="late"):
        await asyncio.wait_for(task, 1)


class Consumer(Service):
    """Stands in for faust's consumer: its `wait_first` (mode's Service) and a suspend-flow event."""

    def __init__(self):
        super().__init__()
        self.suspend_flow = asyncio.Event()


async def test_a_waiting_delivery_is_abandoned_as_faust_abandons_it_when_flow_stops():
    """A rebalance stops the consumer's flow while a delivery waits for flow control: faust's wait_first returns and
    cancels the rest of the delivery, which sees the cancellation at its wait (so a lock it held is released)."""
    consumer, flow, lock = Consumer(), asyncio.Event(), asyncio.Lock()
    seen = []

    async def callback(message):
        async with lock:
            try:
                await flow.wait()  # flow control is suspended: waits
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            seen.append(message)

    rest = delivery.start(callback("m1"))
    assert rest is not None and lock.locked()
    waiting = asyncio.ensure_future(consumer.wait_first(rest, consumer.suspend_flow.wait()))
    await asyncio.sleep(0)
    consumer.suspend_flow.set()
    result = await asyncio.wait_for(waiting, 1)
    await asyncio.sleep(0)
    assert rest not in result.done and not result.stopped
    assert seen == ["cancelled"] and not lock.locked()
    assert not flow.is_set()


async def test_a_waiting_delivery_that_completes_wins_over_the_suspend_flow_event():
    consumer, queue = Consumer(), asyncio.Queue(maxsize=1)
    queue.put_nowait("older")

    async def callback(message):
        await queue.put(message)

    rest = delivery.start(callback("m1"))
    waiting = asyncio.ensure_future(consumer.wait_first(rest, consumer.suspend_flow.wait()))
    await asyncio.sleep(0)
    queue.get_nowait()
    result = await asyncio.wait_for(waiting, 1)
    assert result.done == [rest] and queue.get_nowait() == "m1" and not consumer.suspend_flow.is_set()


@pytest.fixture
def restore_loop():
    yield
    faust_consumer.Consumer._drain_messages = delivery.FAUST_LOOP


def test_create_app_installs_the_eager_loop_unless_switched_off(tmp_path, restore_loop):
    create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path), stages=["power_thermal"])
    assert faust_consumer.Consumer._drain_messages is delivery._drain_messages  # the default
    create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path,
                    streams_eager_delivery=False), stages=["power_thermal"])
    assert faust_consumer.Consumer._drain_messages is delivery.FAUST_LOOP


def test_another_faust_version_keeps_its_own_loop(monkeypatch, restore_loop):
    monkeypatch.setattr(faust, "__version__", "0.16.0")
    assert delivery.install() is False
    assert faust_consumer.Consumer._drain_messages is delivery.FAUST_LOOP
