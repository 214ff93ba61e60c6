"""Dead-letter envelopes: whole originals round-trip, oversized ones are cut to a size that always fits."""

from __future__ import annotations

import hashlib

from schemas.dead_letter import MAX_KEY_BYTES, MAX_ORIGINAL_BYTES, dead_letter, original


def test_a_small_record_round_trips_whole_with_its_size_and_hash():
    raw = b'{"host": "h1", "gpus": "oops"}'
    key, value, headers = dead_letter(raw, key=b"h1", reason="bad gpus", topic="t", partition=3, offset=42,
                                      component="sink")
    facts, back = original(value)
    assert key == b"h1" and back == raw
    assert facts["truncated"] is False and facts["value_bytes"] == len(raw)
    assert facts["value_sha256"] == hashlib.sha256(raw).hexdigest()
    assert (facts["source_topic"], facts["partition"], facts["offset"], facts["reason"]) == ("t", 3, 42, "bad gpus")
    assert dict(headers)["offset"] == b"42"


def test_a_10_mb_record_becomes_a_dead_letter_under_the_producers_1_mb_limit():
    raw = b"x" * (10 * 1024 * 1024)
    key, value, headers = dead_letter(raw, key=b"k" * 100_000, reason="r" * 100_000, topic="t", partition=0,
                                      offset=1, component="streams.health")
    facts, head = original(value)
    assert facts["truncated"] is True and head == raw[:MAX_ORIGINAL_BYTES]
    assert facts["value_bytes"] == len(raw) and facts["value_sha256"] == hashlib.sha256(raw).hexdigest()
    assert len(key) == MAX_KEY_BYTES and facts["reason"].endswith("[cut]")
    assert len(value) + len(key) + sum(len(k) + len(v) for k, v in headers) < 1024 * 1024 - 1024


def test_a_tombstone_has_no_value_and_no_hash():
    _, value, _ = dead_letter(None, reason="empty record value (tombstone)", topic="t", partition=0, offset=0,
                              component="sink")
    facts, back = original(value)
    assert back is None and facts["value_bytes"] is None and facts["truncated"] is False
