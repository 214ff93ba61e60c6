"""The lane's loop over its inbox, pipelined one batch deep: the next batch steps while the broker acknowledges the last
one's outputs, and the writes keep their order (outputs, then state, then the records' acknowledgement, batch after
batch). Driven with an emitter whose acknowledgements the test gives, on the fault-bin stage (an output and a state
write per XID)."""

from __future__ import annotations

import asyncio

import pytest
from faust.types import TP
from faust.types.tuples import Message

from core.settings import load
from schemas.codec import encode
from streams.faust_adapter.app import create_app
from streams.emit import MemoryEmitter
from streams.settings import StreamsSettings
from tests.streams.test_fault_bins import LINE_13, LINE_79, TS0, xid
from tests.streams.helpers import until

PREFIX = "unit."
XID_TOPIC = PREFIX + "fleet.telemetry.xid"
FAULTS, CHANGELOG = PREFIX + "fleet.faults", "fault_bins-hosts-changelog"


class Gated(MemoryEmitter):
    """Records every send; the broker's acknowledgement of each comes when the test gives it."""

    def __init__(self):
        super().__init__()
        self.acks: list[asyncio.Future] = []

    async def send(self, topic, key, value, headers=None, *, partition=None):
        await super().send(topic, key, value, headers, partition=partition)
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]

    def sends(self, suffix: str) -> list[int]:
        return [i for i, s in enumerate(self.sent) if s.topic.endswith(suffix)]

    def ack(self, i: int, error: BaseException | None = None) -> None:
        if error is None:
            self.acks[i].set_result(None)
        else:
            self.acks[i].set_exception(error)


@pytest.fixture
def app(tmp_path):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX,
                    data_dir=tmp_path, stages=["fault_bins"])
    app = create_app(settings, emitter=Gated())
    app.finalize()
    app.flow_control.resume()
    return app


def xids(lane) -> list[Message]:
    """Two XIDs of two hosts, each a batch of its own once put in the lane's inbox one after the other."""
    out = []
    for offset, (line, host, partition) in enumerate(((LINE_79, "h1", 3), (LINE_13, "h2", 5))):
        value = encode(xid(line, TS0 + offset, host=host)[1])
        m = Message(XID_TOPIC, partition, offset, TS0, 0, None, host.encode(), value, None, tp=TP(XID_TOPIC, partition),
                    generation_id=lane.app.consumer_generation_id)
        m.refcount = 1  # as the fetch loop hands it over
        out.append(m)
    return out


class Quiet:
    """The lane's faust agent stream, which carries nothing when the records come through the inbox."""

    async def take_events(self, n: int, within: float):
        await asyncio.Event().wait()
        yield []


def telemetry_lane(app):
    lane = next(ln for ln in app.fleetpulse.lanes if ln.name == "telemetry")
    lane.take_direct(app, 100)
    return lane


async def test_the_next_batch_steps_while_the_last_waits_for_the_broker_and_writes_keep_their_order(app):
    lane, emitter = telemetry_lane(app), app.fleetpulse.emitter
    first, second = xids(lane)
    running = asyncio.ensure_future(lane.run(Quiet()))
    try:
        lane.inbox.put(first)
        await until(lambda: emitter.sends("fleet.faults"), what="the first batch's fault sent")
        lane.inbox.put(second)
        # The second batch steps (its fault goes out) while the first one's is not acknowledged yet ...
        await until(lambda: len(emitter.sends("fleet.faults")) == 2, what="the second batch stepped")
        assert emitter.sends(CHANGELOG) == []  # ... and no state is written before its batch's outputs are
        [out1, out2] = emitter.sends("fleet.faults")
        emitter.ack(out2)  # the second's outputs first: its state still waits for the first batch to be written
        await asyncio.sleep(0.05)
        assert emitter.sends(CHANGELOG) == []
        emitter.ack(out1)
        await until(lambda: len(emitter.sends(CHANGELOG)) == 1, what="the first batch's state sent")
        [state1] = emitter.sends(CHANGELOG)
        assert emitter.sent[state1].key == b'"h1"' and emitter.sent[state1].partition == 3
        assert not first.acked  # acknowledged only once its state is written
        emitter.ack(state1)
        await until(lambda: first.acked and len(emitter.sends(CHANGELOG)) == 2, what="the second batch's state sent")
        state2 = emitter.sends(CHANGELOG)[1]
        assert emitter.sent[state2].key == b'"h2"' and emitter.sent[state2].partition == 5 and not second.acked
        emitter.ack(state2)
        await until(lambda: second.acked, what="the second batch acknowledged")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_batch_whose_outputs_fail_crashes_the_lane_and_neither_it_nor_the_next_is_acknowledged(app):
    lane, emitter = telemetry_lane(app), app.fleetpulse.emitter
    first, second = xids(lane)
    consumer = app.consumer
    running = asyncio.ensure_future(lane.run(Quiet()))
    lane.inbox.put(first)
    await until(lambda: emitter.sends("fleet.faults"), what="the first batch's fault sent")
    lane.inbox.put(second)
    await until(lambda: len(emitter.sends("fleet.faults")) == 2, what="the second batch stepped")
    [out1, out2] = emitter.sends("fleet.faults")
    emitter.ack(out2)
    emitter.ack(out1, RuntimeError("MessageSizeTooLargeError"))  # past the producer's retries
    with pytest.raises(RuntimeError, match="MessageSizeTooLarge"):
        await asyncio.wait_for(running, 5)
    assert isinstance(lane.failed, RuntimeError)
    assert emitter.sends(CHANGELOG) == []  # neither batch's state was written
    assert not first.acked and not second.acked  # both read again by the next worker, from the last commit
    assert consumer.held == {TP(XID_TOPIC, 3): 0, TP(XID_TOPIC, 5): 1}


async def test_a_write_that_fails_while_the_lane_waits_for_records_crashes_it_at_once(app):
    lane, emitter = telemetry_lane(app), app.fleetpulse.emitter
    first, _ = xids(lane)
    running = asyncio.ensure_future(lane.run(Quiet()))
    lane.inbox.put(first)
    await until(lambda: emitter.sends("fleet.faults"), what="the batch's fault sent")
    emitter.ack(emitter.sends("fleet.faults")[0], RuntimeError("NotEnoughReplicas"))
    with pytest.raises(RuntimeError, match="NotEnoughReplicas"):  # no later record needed to notice
        await asyncio.wait_for(running, 5)
    assert not first.acked and app.consumer.held == {TP(XID_TOPIC, 3): 0}
