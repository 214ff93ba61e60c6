"""The fault-bin stage on the stream runtime, once through the telemetry lane's faust agent: both topics, refusals,
table partitions; and a record the rules choke on, isolated by the runtime's step."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from core.settings import load
from schemas.analytics import FaultEvent
from schemas.codec import encode
from streams.faust_adapter.app import create_app, metrics_of
from streams.emit import MemoryEmitter
from streams.fault_bins import stage as fault_bins
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import HostState
from streams.runtime.lane import Wired, run_step
from streams.runtime.spec import Record
from streams.settings import StreamsSettings
from tests.streams.test_fault_bins import LINE_13, LINE_79, TS0, host_sample, xid
from tests.streams.helpers import drain_changelog, until
from tests.streams.helpers import put_on as put

PREFIX = "unit."
XID_TOPIC, SAMPLES_TOPIC = PREFIX + "fleet.telemetry.xid", PREFIX + "fleet.telemetry.samples"


@pytest.fixture
def emitter():
    return MemoryEmitter()


@pytest.fixture
def app(tmp_path, emitter):
    settings = load(StreamsSettings, kafka_bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX,
                    data_dir=tmp_path, stages=["fault_bins"])
    app = create_app(settings, emitter=emitter)
    app.finalize()
    app.flow_control.resume()
    return app


async def test_stage_bins_both_topics_refuses_bad_records_and_keeps_state_on_the_source_partition(app, emitter,
                                                                                                   caplog):
    metrics = metrics_of(app)["fault_bins"]
    h1 = [host_sample(TS0 + k, seq=k, absent=(2,) if k >= 2 else ()) for k in range(5)]  # GPU 2 gone from t=2
    async with app.agents["lane.telemetry"].test_context() as stage:
        await put(stage, XID_TOPIC, b"\x00 not json", b"h9", 6)
        await put(stage, SAMPLES_TOPIC, orjson.dumps({"host": "h9", "ts": 5.0, "gpus": "none"}), b"h9", 6)
        for k, (_, s) in enumerate(h1):
            await put(stage, SAMPLES_TOPIC, encode(s), b"h1", 3)
            if k == 1:
                await put(stage, XID_TOPIC, encode(xid(LINE_79, TS0 + 1.5)[1]), b"h1", 3)
        for i in range(50):  # a storm on h2: one event now, the rest folded
            await put(stage, XID_TOPIC, encode(xid(LINE_13, TS0 + 0.01 * i, host="h2")[1]), b"h2", 5)
        await until(lambda: metrics.received == 56 and len(emitter.to(PREFIX + "fleet.faults")) >= 3)
        await asyncio.sleep(0.2)  # nothing more may follow

    faults = [(s.key, FaultEvent.model_validate_json(s.value)) for s in emitter.to(PREFIX + "fleet.faults")]
    assert sorted((k, f.host, f.gpu_index, f.code, f.bin, f.count) for k, f in faults) == [
        (b"h1", "h1", 2, "gpu_lost", "reboot", 1), (b"h1", "h1", 2, "xid:79", "reboot", 1),
        (b"h2", "h2", 0, "xid:13", "retry", 1)]
    assert (metrics.emitted, metrics.errors, metrics.batches >= 1) == (3, 0, True)
    assert metrics_of(app).refused == {XID_TOPIC: 1, SAMPLES_TOPIC: 1}
    # Refused by the topics' validators, and left to the sink to dead-letter: one dead letter per bad record.
    assert emitter.to(XID_TOPIC + ".dlq") == [] and emitter.to(SAMPLES_TOPIC + ".dlq") == []
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any(f"{XID_TOPIC}[6]@0" in m and "not JSON" in m for m in refusals)
    assert any(f"{SAMPLES_TOPIC}[6]@1" in m and "at `$.gpus`" in m for m in refusals)

    table = app.tables["fault_bins-hosts"]  # a live table: HostState objects in memory, their JSON on the changelog
    assert [w.count for w in table["h2"].open.values()] == [50]  # folded, not lost
    assert table["h1"].gpus["2"].lost is True
    changelog = drain_changelog(emitter, "fault_bins-hosts")
    assert changelog and {(orjson.loads(m.key), m.partition) for m in changelog} == {("h1", 3), ("h2", 5)}
    # What a restart recovers each host from is the very encoding a roll-back returns to, and decodes to its state.
    last = {orjson.loads(m.key): m.value for m in changelog}
    [wired] = [w for lane in app.fleetpulse.lanes for w in lane.stages if w.spec.name == "fault_bins"]
    assert last == {host: wired.durable["hosts", host] for host in ("h1", "h2")}
    assert HostState.from_json(orjson.loads(last["h2"])).xwm == table["h2"].xwm == TS0 + 0.49


def test_a_record_the_rules_choke_on_is_isolated_not_the_batch():
    good = [xid(LINE_79, TS0), xid(LINE_13, TS0 + 1)]
    bad = {"host": "h2", "ts": "soon", "code": 79}  # got past the validator somehow: ordering it raises
    recs = [Record(kind, value, value["host"], XID_TOPIC, 3, i, 0)
            for i, (kind, value) in enumerate([good[0], ("xid", bad), good[1]])]
    emits, state, failed = run_step(Wired(fault_bins.STAGE, fault_bins.STAGE.steps[0], FaultBinConfig(), {"hosts": {}},
                                          None, None, live={"hosts": HostState}), recs)
    assert [(r.offset, reason.split(":")[0]) for r, reason in failed] == [(1, "fault_bins rules failed")]
    assert [FaultEvent.model_validate_json(e.value).code for e in emits] == ["xid:79", "xid:13"]
    assert {key for _, key in state.writes} == {"h1"}


class Memory(dict):
    """A table's in-memory store as the runtime reaches it (faust's Table.data)."""

    @property
    def data(self) -> dict:
        return self


def test_a_batch_that_raises_rolls_its_lent_state_back_to_the_last_durable_value():
    """The first try at a batch changes the stored HostState itself (lent, no copy); when the rules raise, the host
    goes back to what its changelog holds, as after a restart, and the record-by-record retry starts from there."""
    stored = HostState(rack="r1", clock=TS0 - 60)
    durable = {("hosts", "h1"): orjson.dumps(stored.to_json())}  # what its changelog holds
    stored.clock = TS0 - 30  # a change since, kept in memory only
    tables = {"hosts": Memory(h1=stored)}
    w = Wired(fault_bins.STAGE, fault_bins.STAGE.steps[0], FaultBinConfig(), tables, None, None,
              live={"hosts": HostState}, durable=durable)
    bad = {"host": "h2", "ts": "soon", "code": 79}
    recs = [Record(kind, value, value["host"], XID_TOPIC, 3, i, 0)
            for i, (kind, value) in enumerate([xid(LINE_79, TS0), ("xid", bad)])]
    emits, state, failed = run_step(w, recs)
    assert [r.offset for r, _ in failed] == [1] and len(emits) == 1
    assert tables["hosts"]["h1"] == orjson.loads(durable["hosts", "h1"])  # rolled back: the lent object's changes gone
    retried = state.get("hosts", "h1")
    assert retried is not stored and retried.clock == TS0 and retried.xwm == TS0  # from the durable value, + the XID


def test_readings_between_durable_writes_are_kept_in_memory_for_the_next_batch():
    """Samples that change nothing a rule reads are not written to the changelog, yet the next batch sees them: a
    DBE after five quiet one-sample batches says it is new since the reading just before it (once the state was
    re-read from its last durable write every batch, and the evidence named a reading 5 s old)."""
    tables = {"hosts": Memory()}
    w = Wired(fault_bins.STAGE, fault_bins.STAGE.steps[0], FaultBinConfig(), tables, None, None,
              live={"hosts": HostState})
    faults, durable = [], []
    for k in range(7):
        _, s = host_sample(TS0 + k, seq=k, **({"gpu4": {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 1}} if k == 6 else {}))
        emits, state, failed = run_step(w, [Record("sample", s, "h1", SAMPLES_TOPIC, 3, k, 0)])
        assert not failed
        durable += [k for (_, key), (_, is_durable, _) in state.writes.items() if is_durable]
        for (table, key), (value, _, _) in state.writes.items():  # what flush keeps in memory
            tables[table][key] = value
        faults += [FaultEvent.model_validate_json(e.value) for e in emits]
    assert durable == [0, 6]  # first seen, then the DBE: the quiet readings stayed in memory
    assert [(f.code, f.gpu_index, f.evidence["since"]) for f in faults] == [("ecc_dbe", 4, f"{TS0 + 5:.3f}")]


class Partitioned(Memory):
    name, partitions = "hosts", 8  # as a real table: a state key must come with its partition


def test_state_under_a_key_no_record_of_the_batch_carries_sets_that_record_aside():
    """A record keyed by another host than the one it names (the runtime refuses such raw records; this one got past)
    would put state on a changelog partition nobody can name: the step raises at that put, and the record is set
    aside like any the rules choke on, instead of the whole batch failing at the changelog write, batch after batch."""
    w = Wired(fault_bins.STAGE, fault_bins.STAGE.steps[0], FaultBinConfig(), {"hosts": Partitioned()}, None, None,
              live={"hosts": HostState})
    (kind, value) = xid(LINE_79, TS0)
    recs = [Record(kind, value, "h1", XID_TOPIC, 3, 0, 0),
            Record(kind, {**value, "host": "h9"}, "someone-else", XID_TOPIC, 3, 1, 0)]
    emits, state, failed = run_step(w, recs)
    assert [(r.offset, "no record's key in this batch" in reason) for r, reason in failed] == [(1, True)]
    assert {key for _, key in state.writes} == {"h1"}  # what flush will write: the good record's state only


async def test_a_batch_whose_outputs_the_broker_refuses_rolls_its_state_back_so_reading_it_again_acts_again(app,
                                                                                                         emitter):
    """A batch's state is written only after its outputs are acknowledged; when they are not (a producer error past
    its retries), the records are read again (streams/faust_adapter/delivery.py abandon), so the state they moved goes back
    too: kept, it made the second reading of an XID stale and its fault was never sent."""
    from faust.types import TP
    from faust.types.tuples import Message

    class Refusing(MemoryEmitter):
        async def send(self, topic, key, value, headers=None, *, partition=None):
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("MessageSizeTooLargeError"))
            return failed

    lane = next(ln for ln in app.fleetpulse.lanes if ln.name == "telemetry")
    known = host_sample(TS0 - 1, seq=0)[1]  # h1 is in the table before: the step is lent its stored state
    await lane.batch([Message(SAMPLES_TOPIC, 3, 0, TS0, 0, None, b"h1", encode(known), None, tp=TP(SAMPLES_TOPIC, 3))])
    record = encode(xid(LINE_79, TS0)[1])
    message = Message(XID_TOPIC, 3, 0, TS0, 0, None, b"h1", record, None, tp=TP(XID_TOPIC, 3))
    lane.emitter = Refusing()
    with pytest.raises(RuntimeError, match="MessageSizeTooLarge"):
        await lane.batch([message])
    lane.emitter = emitter
    await lane.batch([message])  # read again, as after the crash
    faults = [orjson.loads(s.value) for s in emitter.to(PREFIX + "fleet.faults")]
    assert [(f["host"], f["code"]) for f in faults] == [("h1", "xid:79")]


async def test_a_crashed_lane_restarted_by_faust_takes_nothing_and_lets_go_of_what_it_is_handed(app):
    """Until its worker stops, a crashed lane hands back what the fetch loop still puts in its inbox: never processed,
    never acknowledged, its partition's commits held below it, and not waited for (a record another lane reads too
    would otherwise keep the stop and any rebalance waiting, and a full inbox would block the fetch loop)."""
    from faust.types import TP
    from faust.types.tuples import Message

    lane = next(ln for ln in app.fleetpulse.lanes if ln.name == "telemetry")
    lane.take_direct(app, 100)
    lane.failed = RuntimeError("MessageSizeTooLargeError")
    consumer, tp = app.consumer, TP(XID_TOPIC, 3)
    later = [Message(XID_TOPIC, 3, o, TS0, 0, None, b"h1", encode(xid(LINE_79, TS0 + o)[1]), None, tp=tp)
             for o in (7, 8)]
    for m in later:
        m.refcount = 1
        lane.inbox.put(m)
    running = asyncio.ensure_future(lane.run(None))
    await until(lambda: len(lane.inbox) == 0)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert consumer.held[tp] == 7 and not any(m.acked for m in later)
    assert metrics_of(app)["fault_bins"].received == 0  # taken by no stage
