"""Batches know exactly which offsets they cover, so commits and deduplication tokens are exact."""

from schemas.tables import TABLES
from sinks.batch import Batch


def test_token_and_commit_offsets_cover_rows_and_dead_letters():
    batch = Batch(TABLES["alerts"], "p.fleet.alerts")
    assert batch.empty and not batch.due(1, 0.0)
    batch.add(2, 10, [("row",)])
    batch.cover(2, 11)  # a dead-lettered record: no rows, still committed
    batch.add(0, 5, [("a",), ("b",)])
    assert batch.token() == "p.fleet.alerts|0:5-5,2:10-11"
    assert batch.next_offsets() == {0: 6, 2: 12}
    assert batch.due(max_rows=3, max_age_s=3600)
    assert not batch.due(max_rows=4, max_age_s=3600)
    assert batch.due(max_rows=4, max_age_s=0.0)
    batch.reset()
    assert batch.empty and batch.rows == [] and batch.next_offsets() == {}

