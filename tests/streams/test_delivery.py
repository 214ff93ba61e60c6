"""The fetch loop's choice between a direct hand-over and faust's wait_first, and where it is switched on.

Off by default (FLEETPULSE_STREAMS_DIRECT_DELIVERY): with it on, the whole suite passed twice and hung once (a
drain-storm evaluation's telemetry worker never processed a record, a rebalance waiting on the records handed over).
With it on, `fleetpulse evaluate --kill-worker-at` passed (a full stream queue and a rebalance take faust's path).
"""

from __future__ import annotations

import asyncio

import faust
import pytest
from faust.transport import consumer as faust_consumer

from core.settings import load
from streams.app import create_app
from streams.runtime import delivery
from streams.settings import StreamsSettings


def queue(size: int, maxsize: int = 4) -> asyncio.Queue:
    q = asyncio.Queue(maxsize)
    for i in range(size):
        q.put_nowait(i)
    return q


@pytest.mark.parametrize(("suspended", "active", "sizes", "wait"), [
    (False, True, [0, 3], False),  # room everywhere: hand it over directly
    (False, True, [], False),  # a partition no stream reads (yet): the conductor drops it at once
    (False, True, [1, 4], True),  # one full queue: the conductor would wait for room
    (True, True, [0], True),  # a rebalance stopped the consumer's flow
    (False, False, [0], True),  # the app's flow control is suspended (before the first assignment)
])
def test_waits_only_when_the_hand_over_may_block(suspended, active, sizes, wait):
    assert delivery.must_wait(suspended, active, [queue(n) for n in sizes]) is wait


@pytest.fixture
def restore_loop():
    yield
    faust_consumer.Consumer._drain_messages = delivery.FAUST_LOOP


def test_create_app_installs_the_loop_only_when_switched_on(tmp_path, restore_loop):
    create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path,
                    streams_direct_delivery=True), stages=["power_thermal"])
    assert faust_consumer.Consumer._drain_messages is delivery._drain_messages
    create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path), stages=["power_thermal"])
    assert faust_consumer.Consumer._drain_messages is delivery.FAUST_LOOP  # the default: faust's own loop


def test_another_faust_version_keeps_its_own_loop(monkeypatch, restore_loop):
    monkeypatch.setattr(faust, "__version__", "0.16.0")
    assert delivery.install() is False
    assert faust_consumer.Consumer._drain_messages is delivery.FAUST_LOOP
