"""The hostile-input suite through real parts: every valid record stored once, every bad one dead-lettered once, no
process crashes or stalls, a fault after them still detected; peak memory reported. A longer run:
`python bench/hostile.py --per-topic 3000`."""

from __future__ import annotations

import pytest

from tests.hostile_pipeline import through_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_hostile_records_are_stored_or_dead_lettered_once_and_nothing_crashes(settings_env, tmp_path):
    report = await through_pipeline(per_topic=40, seed=2026, log=tmp_path / "worker.log", timeout=180)
    for topic, stats in report["stats"].items():
        expected = report["expected"][topic]
        assert (stats["rows"], stats["dead_letters"]) == (expected["rows"], expected["refused"]), topic
        assert report["dead_letters"][topic] == report["refused_at"][topic], topic  # one each, the very records
        assert report["worker_refused"][topic] == expected["refused"], topic  # the worker counted each once
    assert report["worker_exit"] == 0  # it stopped on SIGTERM after running through everything
    assert sum(e["refused"] for e in report["expected"].values()) > 20  # the corpus really is hostile
    assert report["peak_rss_mb"]["worker"] < 1024
