"""Every step of every stage gives the same outputs for the same input records, however they are cut into batches: a
worker that lags (a backlog, a burst, a restart's catch-up) decides what one that never lags decides. And a restart at
any record, from any commit behind it, loses no decision and makes none up.

A simulated fleet with one of most kinds of fault runs through all stages one record at a time, each output delivered
at once to the steps that read it (streams/runtime/offline.py delivery_order): the order of every record, internal
ones included, as a never-lagging worker sees it. Each step then reads the same records again, in batches of sizes
hypothesis draws, and must publish the same records per topic and key (the order Kafka keeps) as it did one by one.
"""

from __future__ import annotations

import functools

import orjson

from hypothesis import HealthCheck, given, settings, strategies as st

from agents.simulator.simulate import FleetSimulator
from schemas.codec import encode
from schemas.topics import NCCL, SAMPLES, XID
from streams import registry
from streams.runtime.offline import by_key, delivery_order, offline_steps, replay
from streams.settings import streams_settings

# 16 hosts in one 128-rank job, 6 minutes at 1 s with NCCL every second: every stage has something to say.
MIXED = {
    "name": "batch-invariance",
    "fleet": {"hosts": 16, "jobs": [16]},
    "faults": [
        {"kind": "power_cap", "at": 10, "duration": 320, "host": 6, "gpu": 1, "cap_w": 400},
        {"kind": "xid", "at": 15, "host": 9, "gpu": 2, "code": 13, "hardware": False},
        {"kind": "thermal_runaway", "at": 20, "duration": 60, "host": 5, "gpu": 3},
        {"kind": "slow_rank", "at": 30, "duration": 150, "job": 0, "rank": 21, "slowdown_pct": 25},
        {"kind": "ecc_dbe", "at": 40, "duration": 90, "host": 11, "gpu": 6},
        {"kind": "nvlink_crc", "at": 40, "duration": 60, "host": 12, "gpu": 0, "rate_per_s": 80},
        {"kind": "xid", "at": 50, "host": 8, "gpu": 0, "code": 48},
        {"kind": "row_remap_failure", "at": 60, "host": 13, "gpu": 4},
        {"kind": "sensor_flap", "at": 0, "host": 7, "gpu": 2, "low_c": 84, "high_c": 90, "period_s": 60},
        {"kind": "xid", "at": 100, "host": 10, "gpu": 7, "code": 79},
        {"kind": "gpu_lost", "at": 120, "duration": 60, "host": 14, "gpu": 7},
        {"kind": "host_down", "at": 200, "duration": 150, "host": 15},  # silent long enough to be judged
    ],
}
TICKS = 360
STEPS = [f"{stage.name}.{step.run.__name__}" for stage in registry.select(None) for step in stage.steps]


def inputs():
    sim = FleetSimulator(seed=5, scenario=MIXED, start_ts=1_700_000_000.0, interval=1.0, nccl_interval=1.0)
    for _ in range(TICKS):
        tick = sim.step()
        for topic, records in ((XID, tick.xid), (SAMPLES, tick.samples), (NCCL, tick.nccl)):
            for value in records:
                key = value["job"] if topic is NCCL else value["host"]
                yield topic, key, topic.decode(encode(value))


@functools.cache
def one_by_one():
    """The delivery order, and each step's outputs when it reads the records one at a time."""
    return delivery_order(offline_steps(registry.select(None), streams_settings(None)), inputs())


def fresh(name: str):
    return next(s for s in offline_steps(registry.select(None), streams_settings(None)) if s.name == name)


def test_the_fleet_gives_every_step_something_to_publish():
    """A test of invariance over steps that publish nothing would hold for any code."""
    _, made = one_by_one()
    assert {name: len(made[name]) > 0 for name in STEPS} == {name: True for name in STEPS}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(STEPS), sizes=st.lists(st.integers(1, 800), min_size=1, max_size=6))
def test_a_step_publishes_the_same_records_whatever_its_batches(name, sizes):
    order, made = one_by_one()
    assert by_key(replay(fresh(name), order, sizes)) == by_key(made[name])


def test_every_step_publishes_the_same_records_in_the_worker_s_batches():
    """The worker's own batch size (FLEETPULSE_STREAMS_BATCH_MAX, 500) and a batch of everything, for every step."""
    order, made = one_by_one()
    for name in STEPS:
        want = by_key(made[name])
        for size in (500, len(order)):
            assert by_key(replay(fresh(name), order, [size])) == want, f"{name} in batches of {size}"


# What identifies a decision on each output topic: a restart may publish one again (consumers dedupe by these), never
# lose one or make one up. Health scores' numbers may move after a restart (their smoothing is kept in memory between
# changelog writes, by design); the gates they carry may not.
DECISIONS = {"fleet.faults": ("fault_id",), "fleet.alerts": ("fingerprint", "status", "starts_at"),
             "fleet.drain.events": ("event_id", "action"), "fleet.node.state": ("host", "state", "since"),
             "fleet.stragglers": ("job", "rank", "window_start", "flagged"), "fleet.usable_compute": ("minute_ts",),
             "stragglers-by_host": ("job", "rank", "window_start", "flagged"),
             "fleet.health.scores": ("host", "gpu_index", "gates")}


def decisions(emits) -> set[tuple]:
    out = set()
    for e in emits:
        fields = DECISIONS.get(e.to.name)
        if fields:
            value = orjson.loads(e.value)
            out.add((e.to.name, *(tuple(v) if isinstance(v := value.get(f), list) else v for f in fields)))
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(STEPS), crash=st.floats(0.0, 1.0), lag=st.integers(0, 600), size=st.integers(1, 500))
def test_a_restart_at_any_record_loses_no_decision_and_makes_none_up(name, crash, lag, size):
    """The worker dies after any record; its tables come back from their changelogs, its memory is gone, and it reads
    again from its last commit, up to `lag` records back (their durable state already written)."""
    order, made = one_by_one()
    step = fresh(name)
    mine = step.records(order)
    died = int(crash * len(mine))
    out = []
    for first in range(0, died, size):
        out += step.run(mine[first:min(first + size, died)])
    step.restart()
    for first in range(max(0, died - lag), len(mine), size):
        out += step.run(mine[first:first + size])
    assert decisions(out) == decisions(made[name])
