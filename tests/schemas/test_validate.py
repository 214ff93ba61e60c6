"""The one validator per topic: it accepts what the model accepts, refuses what a consumer cannot use, and the sink's
row extraction never refuses what it accepted."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import DecodeError
from schemas.codec import encode
from schemas.tables import TABLE_BY_TOPIC
from schemas.topics import NCCL, NET, SAMPLES, TOPICS, XID
from tests.schemas.strategies import model_dicts

GPU = {"index": 0, "uuid": "GPU-0", "pci_bus_id": "00000000:18:00.0", "power_w": 400.0, "gpu_temp_c": 61.0}
SAMPLE = {"host": "h1", "rack": "r1", "ts": 1.7e9, "seq": 3, "gpus": [GPU, {**GPU, "index": 1, "uuid": "GPU-1"}]}
XID_EVENT = {"host": "h1", "ts": 1.7e9, "code": 79, "gpu_index": 0, "message": "fallen off the bus"}
TIMING = {"job": "j", "rank": 3, "world_size": 8, "host": "h1", "collective": "AllReduce", "seq": 5, "bytes": 1024,
          "ts": 1.7e9, "compute_us": 900.0, "collective_us": 120.0}


def changed(record: dict, path: tuple, value) -> bytes:
    out = copy.deepcopy(record)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return orjson.dumps(out)


@pytest.mark.parametrize("topic, record, path, value, reason", [
    (SAMPLES, SAMPLE, ("gpus", 1, "power_w"), "400", r"Expected `float \| null`, got `str` - at `\$.gpus\[1\].power_w`"),
    (SAMPLES, SAMPLE, ("ts",), -5, r"`float` > 0.0 - at `\$.ts`"),
    (SAMPLES, SAMPLE, ("gpus", 0, "gpu_temp_c"), True, r"got `bool` - at `\$.gpus\[0\].gpu_temp_c`"),
    (SAMPLES, SAMPLE, ("gpus", 0, "index"), 256, r"<= 255 - at `\$.gpus\[0\].index`"),
    (SAMPLES, SAMPLE, ("gpus", 0, "index"), -1, r">= 0 - at `\$.gpus\[0\].index`"),
    (SAMPLES, SAMPLE, ("seq",), -1, r">= 0 - at `\$.seq`"),
    (SAMPLES, SAMPLE, ("ts",), 1e19, r"< 10413792000.0 - at `\$.ts`"),  # past what DateTime64 holds
    (SAMPLES, SAMPLE, ("gpus", 0, "energy_mj"), 1.5, r"Expected `int \| null`, got `float`"),
    # numbers kept as whole units or milliwatts: refused past what their integer column holds, not failed in the insert
    (SAMPLES, SAMPLE, ("gpus", 0, "gpu_temp_c"), 40000.0, r"< 32767.25 - at `\$.gpus\[0\].gpu_temp_c`"),
    (SAMPLES, SAMPLE, ("gpus", 0, "power_w"), 5e6, r"< 4294967.29525 - at `\$.gpus\[0\].power_w`"),
    (SAMPLES, SAMPLE, ("gpus", 0, "sm_clock_mhz"), 70000, r"< 65535.25 - at `\$.gpus\[0\].sm_clock_mhz`"),
    (SAMPLES, SAMPLE, ("host",), "", r"length >= 1 - at `\$.host`"),
    (SAMPLES, SAMPLE, ("gpus",), {"0": GPU}, r"Expected `array`, got `object` - at `\$.gpus`"),
    (XID, XID_EVENT, ("code",), 2**40, r"<= 4294967295 - at `\$.code`"),
    (XID, XID_EVENT, ("code",), "79", r"Expected `int`, got `str` - at `\$.code`"),
    (XID, XID_EVENT, ("kind",), "oops", r"Invalid enum value 'oops' - at `\$.kind`"),
    (XID, XID_EVENT, ("count",), 0, r">= 1 - at `\$.count`"),
    (NCCL, TIMING, ("rank",), 8, r"rank 8 is not below world_size 8"),
    (NCCL, TIMING, ("compute_us",), -1.0, r">= 0.0 - at `\$.compute_us`"),
    (NCCL, TIMING, ("seq",), True, r"got `bool` - at `\$.seq`"),
])
def test_a_bad_field_is_refused_with_its_path(topic, record, path, value, reason):
    assert topic.decode(orjson.dumps(record))  # the record itself is good
    with pytest.raises(DecodeError, match=reason):
        topic.decode(changed(record, path, value))


@pytest.mark.parametrize("raw, reason", [(b"{", "not JSON"), (b"[1]", "Expected `object`"), (None, "tombstone"),
                                         (b'{"host": "h1"}', "missing required field `ts`")])
def test_what_is_no_record_at_all_is_refused(raw, reason):
    with pytest.raises(DecodeError, match=reason):
        SAMPLES.decode(raw)


def test_decoded_values_are_plain_json_values_with_top_level_defaults():
    value = SAMPLES.decode(orjson.dumps({k: v for k, v in SAMPLE.items() if k != "rack"}))
    assert value["rack"] == "" and value["source"] == "nvml" and value["job"] is None
    assert value["gpus"][0] == GPU  # nested readings keep only what was sent
    fault = TOPICS["fleet.faults"].decode(orjson.dumps({
        "fault_id": "f", "ts": 1.7e9, "host": "h", "code": "xid:79", "bin": "reboot", "rule": "catalog",
        "first_ts": 1.7e9, "last_ts": 1.7e9}))
    assert type(fault["bin"]) is str and fault["reasons"] == [] and fault["evidence"] == {}


def test_unknown_fields_are_dropped_so_old_consumers_read_new_producers():
    assert "added_later" not in SAMPLES.decode(orjson.dumps({**SAMPLE, "added_later": 1}))


def test_a_sample_without_gpus_is_valid_and_stores_no_rows():
    value = SAMPLES.decode(orjson.dumps({**SAMPLE, "gpus": []}))
    assert TABLE_BY_TOPIC[SAMPLES.name].rows(value, 0, 0) == []


def test_a_cross_field_rule_sees_the_default_of_a_field_the_record_left_out():
    value = NET.decode(orjson.dumps({"host": "h1", "ts": 1.7e9, "seq": 0}))  # no "ports": its default is []
    assert value["ports"] == [] and TABLE_BY_TOPIC[NET.name].rows(value, 0, 0) == []


@pytest.mark.parametrize("topic", TOPICS.values(), ids=lambda t: t.name)
def test_whatever_the_model_accepts_the_validator_and_the_sink_accept(topic):
    table = TABLE_BY_TOPIC[topic.name]

    @settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(model_dicts(topic.model))
    def check(value):
        raw = encode(topic.model.model_validate(value))
        decoded = topic.decode(raw)
        assert decoded == orjson.loads(raw) or set(decoded) >= set(orjson.loads(raw))
        table.rows(decoded, 0, 0)

    check()


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                 st.text(max_size=4), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                                            st.integers(), max_size=2))


@pytest.mark.parametrize("topic", [SAMPLES, XID, NCCL] + [t for t in TOPICS.values() if t not in (SAMPLES, XID, NCCL)],
                         ids=lambda t: t.name)
def test_the_validator_never_passes_what_the_sink_would_refuse(topic):
    """One field of a good record replaced by junk: either the validator refuses it, or the sink can store it."""
    table = TABLE_BY_TOPIC[topic.name]

    @settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(model_dicts(topic.model), st.data())
    def check(value, data):
        record = orjson.loads(encode(topic.model.model_validate(value)))
        target = record
        if topic is SAMPLES and record["gpus"] and data.draw(st.booleans()):
            target = record["gpus"][0]
        target[data.draw(st.sampled_from(sorted(target)))] = data.draw(JUNK)
        try:
            raw = orjson.dumps(record)
        except TypeError:  # an integer past 64 bits: no producer can send it
            return
        try:
            decoded = topic.decode(raw)
        except DecodeError:
            return
        table.rows(decoded, 0, 0)

    check()


def test_a_record_keyed_by_another_host_than_its_own_is_refused():
    raw = orjson.dumps(SAMPLE)
    assert SAMPLES.decode_keyed(SAMPLE["host"].encode(), raw)["host"] == SAMPLE["host"]
    for key in (b"someone-else", None, b""):
        with pytest.raises(DecodeError, match="is not its host"):
            SAMPLES.decode_keyed(key, raw)


def test_a_record_stamped_far_ahead_of_the_consumers_clock_is_refused(monkeypatch):
    import time

    from schemas.validate import max_future_s

    now = time.time()
    assert SAMPLES.decode(orjson.dumps({**SAMPLE, "ts": now + 3600}))  # an hour ahead (a simulation running flat out)
    with pytest.raises(DecodeError, match=r"ts .* is 8760.0 h ahead of this consumer's clock"):
        SAMPLES.decode(orjson.dumps({**SAMPLE, "ts": now + 365 * 86_400}))  # an RTC a year ahead
    step = orjson.loads(encode(NCCL.model.model_validate({
        "job": "j", "world_size": 2, "host": "h", "collective": "AllReduce", "seq": 1, "bytes": 1,
        "ranks": [{"rank": 0, "ts": now, "compute_us": 1.0, "collective_us": 1.0}]})))
    step["ranks"][0]["ts"] = now + 30 * 86_400
    with pytest.raises(DecodeError, match="ahead of this consumer's clock"):
        NCCL.decode(orjson.dumps(step))
    monkeypatch.setenv("FLEETPULSE_MAX_FUTURE_S", "60")
    max_future_s.cache_clear()
    try:
        with pytest.raises(DecodeError, match="FLEETPULSE_MAX_FUTURE_S=60"):
            SAMPLES.decode(orjson.dumps({**SAMPLE, "ts": now + 3600}))
    finally:
        monkeypatch.delenv("FLEETPULSE_MAX_FUTURE_S")
        max_future_s.cache_clear()


def test_a_rank_time_past_any_working_timer_is_refused():
    """compute_us and collective_us are Float64 columns, so only the model bounds them: a broken timer's 1e306 was
    stored and overflowed the straggler windows' nanosecond sums to infinity (the hostile corpus at 3,000 per topic)."""
    step = {"job": "j", "world_size": 2, "host": "h", "collective": "AllReduce", "seq": 1, "bytes": 1,
            "ranks": [{"rank": 0, "ts": 1.7e9, "compute_us": 3.6e9, "collective_us": 1.0}]}  # an hour: fine
    assert NCCL.decode(orjson.dumps(step))["ranks"][0]["compute_us"] == 3.6e9
    for field in ("compute_us", "collective_us"):
        bad = {**step, "ranks": [{**step["ranks"][0], field: 1e306}]}
        with pytest.raises(DecodeError, match=rf"<= 1000000000000.0 - at `\$.ranks\[0\].{field}`"):
            NCCL.decode(orjson.dumps(bad))


def test_a_record_over_the_size_limit_is_refused_before_it_is_decoded(monkeypatch):
    from schemas.validate import max_record_bytes

    max_record_bytes.cache_clear()  # the default, whatever an earlier test left cached
    padded = orjson.dumps({**SAMPLE, "note": "x" * 1_100_000})  # well-formed: an unknown key a consumer would drop
    with pytest.raises(DecodeError, match=r"record of 1,10\d,\d{3} bytes is over "
                                          r"FLEETPULSE_MAX_RECORD_BYTES=1,048,576"):
        SAMPLES.decode(padded)
    monkeypatch.setenv("FLEETPULSE_MAX_RECORD_BYTES", str(2 << 20))
    max_record_bytes.cache_clear()
    try:
        assert "note" not in SAMPLES.decode(padded)  # an operator who allows more gets it decoded
        monkeypatch.setenv("FLEETPULSE_MAX_RECORD_BYTES", "4096")
        max_record_bytes.cache_clear()
        with pytest.raises(DecodeError, match="over FLEETPULSE_MAX_RECORD_BYTES=4,096"):
            SAMPLES.decode(orjson.dumps({**SAMPLE, "note": "x" * 4096}))
    finally:
        monkeypatch.delenv("FLEETPULSE_MAX_RECORD_BYTES")
        max_record_bytes.cache_clear()


def test_the_pipelines_own_outputs_may_key_otherwise():
    from schemas.topics import TOPICS

    alerts = TOPICS["fleet.alerts"]
    rack_alert = orjson.loads(encode(alerts.model.model_validate({
        "fingerprint": "f", "status": "firing", "alertname": "RackPowerOverBudget", "severity": "warning", "ts": 1e9,
        "starts_at": 1e9, "host": "", "rack": "r1", "value": 9e4, "threshold": 8e4, "summary": "rack r1 over budget"})))
    assert alerts.decode_keyed(b"fleet", orjson.dumps(rack_alert))["rack"] == "r1"  # keyed by rack/fleet on purpose
