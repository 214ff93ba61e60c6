"""The health stage on the stream runtime, once through the telemetry lane's faust agent: rows on change, dead
letters of its internal records, straggler re-keying."""

from __future__ import annotations


import orjson
import pytest

from core.settings import load
from schemas.analytics import FaultEvent, HealthScore, StragglerScore
from schemas.codec import encode
from schemas.dead_letter import original
from schemas.topics import FAULTS, HEALTH_STRAGGLERS, SAMPLES, STRAGGLERS
from streams.faust_adapter.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.health.rules import HostHealth
from streams.runtime.state import StepState
from streams.settings import StreamsSettings
from tests.streams.helpers import drain_changelog, gpu, put_on, sample, until

PREFIX = "unit."
SAMPLES_TOPIC, FAULTS_TOPIC, STRAGGLERS_TOPIC = (PREFIX + t for t in (SAMPLES.name, FAULTS.name, STRAGGLERS.name))
BY_HOST = f"{PREFIX}fleetpulse-streams-{HEALTH_STRAGGLERS.name}"
T0 = 50_000.0


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX, data_dir=tmp_path,
                    streams_batch_within_s=0.05)
    app = create_app(settings, stages=["health"], emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


async def test_scores_on_change_gates_from_faults_and_dead_letters(app, emitter):
    m = metrics_of(app)["health"]
    fault = FaultEvent(fault_id="h1/3/xid:79", ts=T0 + 25, host="h1", gpu_index=3, code="xid:79", bin="reboot",
                       rule="catalog", first_ts=T0 + 25, last_ts=T0 + 25, evidence={"line": "fallen off the bus"})
    h1 = [encode(sample("h1", T0 + 10 * k, [gpu(i) for i in range(8)], seq=k)) for k in range(6)]
    h2 = [encode(sample("h2", T0 + 10 * k + 1, [gpu(i) for i in range(4)], seq=k)) for k in range(6)]
    async with app.agents["lane.telemetry"].test_context() as stage:
        async def batch(*records: tuple[bytes, bytes, int]) -> None:  # one take() batch each
            for value, key, partition in records:
                topic = FAULTS_TOPIC if b"fault_id" in value else BY_HOST if value == b"{broken" else SAMPLES_TOPIC
                await put_on(stage, topic, value, key, partition)
            done = m.received + sum(value != b"{broken" for value, _, _ in records)
            await until(lambda: m.received == done and m.batches == batch.n + 1)
            batch.n += 1

        batch.n = 0
        await batch((h1[0], b"h1", 3), (h2[0], b"h2", 5))
        await batch((h1[1], b"h1", 3), (h2[1], b"h2", 5), (h1[2], b"h1", 3), (h2[2], b"h2", 5))
        await batch((encode(fault), b"h1", 3))  # between samples: scored at its own time
        await batch(*[(h1[k], b"h1", 3) for k in range(3, 6)], *[(h2[k], b"h2", 5) for k in range(3, 6)],
                    (b"{broken", b"h9", 6))
        assert m.errors == 1

    rows = [HealthScore.model_validate_json(s.value) for s in emitter.to(PREFIX + "fleet.health.scores")]
    nodes = [(r.host, r.ts - T0, r.score, r.gates) for r in rows if r.gpu_index is None]
    assert nodes == [("h1", 0, 100.0, []), ("h2", 1, 100.0, []),
                     ("h1", 25, 20.0, ["gpu3/fault_bin:reboot"])]  # quiet otherwise: no change, no heartbeat yet
    assert sum(r.gpu_index is not None for r in rows) == 8 + 4 + 1  # every GPU once, then GPU 3 when gated
    assert {s.key for s in emitter.to(PREFIX + "fleet.health.scores")} == {b"h1", b"h2"}
    assert m.emitted == len(rows) == 16
    [dead] = emitter.to(PREFIX + "fleet.stragglers.dlq")  # an internal record: the worker dead-letters it
    facts, raw = original(dead.value)
    assert raw == b"{broken" and facts["reason"].startswith("not JSON") and facts["component"] == "streams.health"
    assert facts["source_topic"] == BY_HOST
    # State recovers where the host's records live: changelog partition = source partition, written on news.
    table = app.tables["health-hosts"]  # the live state between durable writes, its JSON after one
    held = {h: v if isinstance(v, HostHealth) else HostHealth.from_json(v) for h, v in table.items()}
    assert held["h1"].faults[0][0] == "h1/3/xid:79" and held["h2"].installed == 4
    changelog = drain_changelog(emitter, "health-hosts")
    assert {(orjson.loads(c.key), c.partition) for c in changelog} == {("h1", 3), ("h2", 5)}


async def test_stragglers_are_rekeyed_by_host_only_when_flagged_or_recently_flagged(app, emitter):
    def score(rank: int, flagged: bool, windows_flagged: int) -> bytes:
        return encode(StragglerScore(ts=T0, job="j1", rank=rank, host=f"h{rank}", gpu_index=rank % 8,
                                     window_start=T0 - 60, window_end=T0, value=110.0, median=100.0, mad=1.0, z=7.0,
                                     slowdown_pct=10.0, flagged=flagged, windows_flagged=windows_flagged,
                                     windows_seen=5))

    async with app.agents["lane.telemetry"].test_context() as stage:
        await put_on(stage, STRAGGLERS_TOPIC, score(1, True, 3), b"j1", 1)
        await put_on(stage, STRAGGLERS_TOPIC, score(2, False, 0), b"j1", 1)  # never flagged: nothing to tell
        await put_on(stage, STRAGGLERS_TOPIC, score(3, False, 1), b"j1", 1)  # a flag that may just have cleared
        await put_on(stage, STRAGGLERS_TOPIC, b"[]", b"j1", 1)
        await until(lambda: len(emitter.sent) >= 2 and metrics_of(app).refused[STRAGGLERS_TOPIC] == 1)
    forwarded = [s for s in emitter.sent if s.topic.endswith("health-stragglers_by_host")]
    assert [(s.key, orjson.loads(s.value)["flagged"]) for s in forwarded] == [(b"h1", True), (b"h3", False)]
    assert emitter.to(PREFIX + "fleet.stragglers.dlq") == []  # a registry topic: the sink dead-letters it


def test_a_live_table_hands_a_retried_step_a_copy_and_keeps_the_stored_state_whole():
    """Between durable writes the health table holds HostHealth objects. A batch's first try borrows them (tested in
    test_fault_bins_stage); its retry record by record, after it raised, gets copies (StepState without `lend`), so a
    record that raises leaves nothing half-changed behind. A value recovered from the changelog (JSON) is decoded the
    same way; scan shows the stored objects themselves."""
    stored = HostHealth(wm=5.0, rack="r1", installed=1, present=[0], faults=[["f1", 1.0, 1.0, 0, "xid:79", "reboot", 1]])
    state = StepState({"hosts": {"h1": stored, "h2": stored.to_json()}}, {"h1": 3}, live={"hosts": HostHealth})
    mine = state.get("hosts", "h1")
    assert mine is not stored and mine == stored
    mine.wm, mine.faults[0][2] = 9.0, 2.0
    trial = state.child().get("hosts", "h1")
    assert trial is not stored and (stored.wm, stored.faults[0][2]) == (5.0, 1.0)
    assert state.get("hosts", "h2") == stored and state.get("hosts", "h3") is None
    assert state.scan("hosts")["h1"] is stored and state.scan("hosts")["h2"] == stored
    state.put("hosts", "h1", mine)
    assert state.get("hosts", "h1") is mine  # the step's own write of this batch
