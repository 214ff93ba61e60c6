"""Every topic's model survives encode -> decode -> validate unchanged, and its JSON Schema accepts it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from schemas.codec import decode, encode, validate
from schemas.cli_export import json_schemas
from schemas.topics import TOPICS
from tests.schemas.strategies import model_dicts


@pytest.mark.parametrize("topic", TOPICS.values(), ids=lambda t: t.name)
def test_model_round_trips_through_the_wire(topic):
    @settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(model_dicts(topic.model))
    def check(value):
        model = topic.model.model_validate(value)
        raw = encode(model)
        assert validate(topic.model, raw) == model
        assert decode(raw) == model.model_dump(mode="json")
        assert topic.key_of(decode(raw)) == str(getattr(model, topic.key)).encode()

    check()


def test_json_schema_names_every_field_and_the_kafka_facts():
    schemas = json_schemas()
    assert set(schemas) == set(TOPICS)
    for name, schema in schemas.items():
        model = TOPICS[name].model
        assert set(schema["properties"]) == set(model.model_fields)
        assert schema["x-kafka"]["key"] in model.model_fields


def test_malformed_json_is_a_decode_error_not_a_crash():
    from core.errors import DecodeError

    for raw in (b"{", b"\xff\xfe", None):
        with pytest.raises(DecodeError):
            decode(raw)
    with pytest.raises(DecodeError, match="HostSample"):
        validate(TOPICS["fleet.telemetry.samples"].model, b'{"host": "h"}')
