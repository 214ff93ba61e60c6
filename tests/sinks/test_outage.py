"""The sink's waiting (sinks/outage.py), on a fake clock: what waiting mends is tried again, capped, logged when it
begins, once a minute while it lasts and when it ends; anything else is raised at once."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from core.errors import StoreError
from sinks.outage import Outages


class Clock:
    def __init__(self):
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, error: Exception):
    calls = []

    async def call():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "stored"

    return call, calls


AWAY = StoreError("insert into gpu_samples failed: Connection refused", action=StoreError.WAIT, name="unreachable")


async def test_an_outage_is_waited_out_with_a_capped_backoff_and_logged_once_a_minute(caplog):
    clock = Clock()
    outages = Outages(wait_max_s=5.0, clock=clock, sleep=clock.sleep)
    call, calls = failing(40, AWAY)  # 40 refusals: about three minutes at the cap
    with caplog.at_level(logging.WARNING, logger="fleetpulse.sink"):
        assert await outages.call("insert into gpu_samples", call) == "stored"
    assert len(calls) == 41
    assert clock.slept[:6] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0] and max(clock.slept) == 5.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("the store is not taking writes (insert into gpu_samples failed: Connection refused)")
    still = [line for line in lines if line.startswith("still waiting")]
    waited = sum(clock.slept)
    assert [line.split(" (")[0] for line in still] == ["still waiting for the store after 61 s",
                                                       "still waiting for the store after 121 s"]
    assert "Connection refused" in still[0]
    assert lines[-1].startswith(f"the store takes writes again after {waited:.1f} s (40 tries, unreachable)")
    assert outages.count == 1 and not outages.waiting and outages.by_error == {"unreachable": 40}
    assert outages.total_waited_s() == pytest.approx(waited)


async def test_the_state_says_what_the_sink_waits_for_while_it_waits():
    clock = Clock()
    outages = Outages(clock=clock, sleep=clock.sleep)
    seen = []

    async def call():
        seen.append(outages.state())
        if len(seen) < 3:
            raise StoreError("too many parts", action=StoreError.WAIT, name="TOO_MANY_PARTS")

    await outages.call("insert into xid_events", call)
    assert seen[0]["waiting"] is False
    assert seen[2]["waiting"] and seen[2]["current"]["error"] == "TOO_MANY_PARTS"
    assert seen[2]["current"]["what"] == "insert into xid_events" and seen[2]["current"]["tries"] == 2
    assert seen[2]["current"]["for_s"] == pytest.approx(0.2 + 0.4)
    assert outages.state()["waiting"] is False and outages.state()["outages"] == 1


@pytest.mark.parametrize("error", [
    StoreError("no such table", action=StoreError.STOP, name="UNKNOWN_TABLE"),
    StoreError("a value out of range", action=StoreError.SPLIT, name="VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE"),
    TopicAuthorizationFailedError(),
    ValueError("a bug"),
])
async def test_what_waiting_cannot_mend_is_raised_at_once(error):
    clock = Clock()
    outages = Outages(clock=clock, sleep=clock.sleep)
    call, calls = failing(1, error)
    with pytest.raises(type(error)):
        await outages.call("insert", call)
    assert len(calls) == 1 and clock.slept == [] and outages.count == 0


async def test_a_broker_away_is_waited_out_like_the_store():
    clock = Clock()
    outages = Outages(clock=clock, sleep=clock.sleep)
    call, calls = failing(3, KafkaConnectionError())
    assert await outages.call("dead letter", call) == "stored"
    assert len(calls) == 4 and outages.by_error == {"KafkaConnectionError": 3}
