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



def test_a_recreated_topics_offsets_get_tokens_of_their_own():
    """Once a topic was recreated its offsets begin again: the same range is other records, so ClickHouse's insert
    deduplication must not take them for a retry of an old batch. Before any reset, tokens stay as they were."""
    old, new = Batch(TABLES["alerts"], "p.fleet.alerts"), Batch(TABLES["alerts"], "p.fleet.alerts", epoch=1)
    for batch in (old, new):
        batch.add(0, 0, [("row",)])
    assert old.token() == "p.fleet.alerts|0:0-0"
    assert new.token() == "p.fleet.alerts#1|0:0-0"
    assert new.segment_token(new.entries) != old.segment_token(old.entries)
