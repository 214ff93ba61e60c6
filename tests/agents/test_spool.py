"""The on-disk spool: order, the size bound (oldest dropped and counted), restart recovery, torn records."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.spool import Spool, SpoolRecord
from core.errors import ConfigError
from tests.conftest import REPO


def rec(i: int, size: int = 40, topic: str = "fleet.telemetry.samples") -> SpoolRecord:
    return SpoolRecord(topic, f"host-{i % 3}".encode(), f"{i:08d}".encode().ljust(size, b"."), 1_700_000_000.0 + i)


def drain(spool: Spool, batch: int = 7) -> list[SpoolRecord]:
    out = []
    while items := spool.peek(batch):
        out += [i.record for i in items]
        spool.commit(items[-1])
    return out


def seqs(records: list[SpoolRecord]) -> list[int]:
    return [int(r.value[:8]) for r in records]


def test_records_come_back_in_order_with_every_field(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    odd = SpoolRecord("t", None, b"", 1.5, (("trace", b"\x00\xff"), ("empty", b"")))
    spool.append(odd)
    for i in range(500):
        spool.append(rec(i))
    assert len(spool) == 501 and spool.appended == 501
    assert len(list(tmp_path.glob("seg-*.spool"))) > 3  # rotated across segments
    first = spool.peek(1)[0]
    assert first.record == odd
    spool.commit(first)
    assert seqs(drain(spool)) == list(range(500))
    assert len(spool) == 0 and spool.bytes == 0 and not list(tmp_path.glob("seg-*.spool"))
    spool.close()


def test_peek_without_commit_returns_the_same_records(tmp_path):
    spool = Spool(tmp_path)
    for i in range(10):
        spool.append(rec(i))
    assert seqs([i.record for i in spool.peek(4)]) == [0, 1, 2, 3]
    assert seqs([i.record for i in spool.peek(4)]) == [0, 1, 2, 3]
    spool.commit(spool.peek(4)[1])  # commit a prefix only
    assert seqs([i.record for i in spool.peek(3)]) == [2, 3, 4]
    assert len(spool) == 8


def test_full_spool_drops_the_oldest_and_counts_them(tmp_path):
    spool = Spool(tmp_path, max_bytes=16 * 1024, segment_bytes=2048)
    frame = len(rec(0, size=100).encode())
    for i in range(2000):
        spool.append(rec(i, size=100))
        assert spool.bytes <= spool.max_bytes
    kept = seqs(drain(spool, batch=50))
    assert kept == list(range(2000 - len(kept), 2000))  # the newest, contiguous, in order
    assert spool.dropped == 2000 - len(kept)
    assert len(kept) * frame >= 16 * 1024 * 0.7  # whole segments go, so most of the budget stays in use


def test_a_restart_replays_exactly_what_was_not_committed(tmp_path):
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=1 << 20)
    for i in range(100):
        spool.append(rec(i))
    items = spool.peek(30)
    spool.commit(items[-1])
    spool.close()  # the process ends; the cursor and segments stay

    again = Spool(tmp_path, segment_bytes=1024, max_bytes=1 << 20)
    assert len(again) == 70
    again.append(rec(100))
    assert seqs(drain(again)) == list(range(30, 101))
    again.close()
    assert len(Spool(tmp_path)) == 0


def test_a_killed_process_loses_no_appended_record(tmp_path):
    """Appends are unbuffered writes: what a process appended is on disk even if it dies without closing."""
    script = (f"from agents.spool import Spool, SpoolRecord\n"
              f"s = Spool({str(tmp_path)!r}, fsync='never')\n"
              f"for i in range(20): s.append(SpoolRecord('t', b'k', b'%08d' % i, 1.0))\n"
              f"import os; os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    assert seqs(drain(Spool(tmp_path))) == list(range(20))


@pytest.mark.parametrize("damage", ["short_header", "short_payload", "bad_crc"])
def test_a_torn_last_record_is_cut_off_and_counted(tmp_path, damage):
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(rec(i))
    spool.close()
    (segment,) = tmp_path.glob("seg-*.spool")
    frame = rec(5).encode()
    torn = {"short_header": frame[:5], "short_payload": frame[:-3],
            "bad_crc": frame[:8] + bytes([frame[8] ^ 0xFF]) + frame[9:]}[damage]
    with open(segment, "ab") as f:
        f.write(torn)

    again = Spool(tmp_path)
    assert again.corrupt == 1 and len(again) == 5
    again.append(rec(6))  # the spool goes on after the damage
    assert seqs(drain(again)) == [0, 1, 2, 3, 4, 6]


def test_prepend_puts_records_before_everything(tmp_path):
    spool = Spool(tmp_path, segment_bytes=512, max_bytes=1 << 20)
    for i in range(10, 20):
        spool.append(rec(i))
    spool.prepend([rec(i) for i in range(10)])
    spool.close()
    assert seqs(drain(Spool(tmp_path, segment_bytes=512, max_bytes=1 << 20))) == list(range(20))


def test_an_unreadable_cursor_replays_everything_rather_than_losing_anything(tmp_path):
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(rec(i))
    spool.commit(spool.peek(2)[-1])
    spool.close()
    (tmp_path / "cursor.json").write_text("{not json")
    assert seqs(drain(Spool(tmp_path))) == list(range(5))


def test_one_process_per_spool_directory_and_bad_settings_refused(tmp_path):
    spool = Spool(tmp_path)
    with pytest.raises(ConfigError, match="in use"):
        Spool(tmp_path)
    spool.close()
    with pytest.raises(ConfigError, match="fsync"):
        Spool(tmp_path, fsync="sometimes")
    with pytest.raises(ConfigError, match="max_bytes"):
        Spool(tmp_path, max_bytes=100)
    with pytest.raises(ValueError, match="exceeds"):
        Spool(tmp_path, max_bytes=8192).append(rec(0, size=4000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=40)),
                          st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=3)),
                max_size=40))
def test_record_encoding_round_trips(tmp_path_factory, entries):
    records = [SpoolRecord(f"topic.{i}", key, value, 1.0 + i, tuple(headers))
               for i, (value, key, headers) in enumerate(entries)]
    spool = Spool(tmp_path_factory.mktemp("spool"), segment_bytes=2048)
    for record in records:
        spool.append(record)
    assert drain(spool) == records
    spool.close()
