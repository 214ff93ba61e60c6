"""Hostile records against the one validator per raw topic: each is refused with a DecodeError, or it is a record the
contract (the pydantic model) accepts and the sink can turn into rows. Nothing else — no RecursionError from deep
nesting, no OverflowError from huge numbers — may escape, since any other exception stops the consumer."""

from __future__ import annotations

import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import DecodeError
from schemas.tables import TABLE_BY_TOPIC
from tests.hostile_corpus import GOOD, corpus

NOW = time.time()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32))
def test_every_hostile_record_is_refused_or_is_a_record_the_contract_accepts(seed):
    outcome = Counter()
    for h in corpus(12, seed=seed, now=NOW, hostile_share=0.9):
        try:
            value = h.topic.decode_keyed(h.key, h.value)
        except DecodeError:
            outcome["refused"] += 1
            continue
        h.topic.model.model_validate(value)  # raises (and fails the test) if the validator let through a bad one
        TABLE_BY_TOPIC[h.topic.name].rows(value, 0, 0)
        outcome["accepted"] += 1
    assert sum(outcome.values()) == 12 * len(GOOD)  # every raw topic's records


def test_nesting_deeper_than_the_stack_is_a_decode_error_not_a_crash():
    from schemas.topics import SAMPLES

    raw = b'{"host":"h","ts":1e9,"seq":0,"gpus":[],"extra":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    try:
        SAMPLES.decode(raw)
    except DecodeError as exc:
        assert "nested too deep" in str(exc)
    else:
        raise AssertionError("a 100,000-deep value was accepted")
