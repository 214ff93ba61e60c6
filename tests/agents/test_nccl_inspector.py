"""InspectorCollector: following per-process JSON-lines dumps (append, new file, partial line, truncation)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.nccl import InspectorCollector
from schemas.events import NcclTiming

# The record shapes of the NCCL Inspector README (format v4.0): plain and verbose (event_trace_*).
README_RECORD = {
    "header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1},
    "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "profiler_plugin",
                 "dump_timestamp_us": 1748030377748202, "hostname": "example-hostname", "pid": 1639453},
    "coll_perf": {"coll": "AllReduce", "coll_sn": 1407, "coll_msg_size_bytes": 17179869184,
                  "coll_exec_time_us": 61974, "coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099},
}


def verbose(sn: int, start_us: int, exec_us: int, *, rank: int = 4, comm: str = "0xe62dedaa97644a") -> dict:
    return {
        "header": {"id": comm, "rank": rank, "n_ranks": 8, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "9019a1912-dirty",
                     "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": start_us + exec_us + 900,
                     "hostname": "example-hostname", "pid": 438776},
        "coll_perf": {"coll": "ReduceScatter", "coll_sn": sn, "coll_msg_size_bytes": 2147483648,
                      "coll_exec_time_us": exec_us, "coll_timing_source": "kernel_gpu",
                      "coll_algobw_gbs": 418.439467, "coll_busbw_gbs": 366.134533,
                      "event_trace_sn": {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []},
                      "event_trace_ts": {"coll_start_ts": start_us, "coll_stop_ts": start_us + 5,
                                         "kernel_events": [{"channel_id": 0, "kernel_start_ts": start_us + 122,
                                                            "kernel_stop_ts": start_us + exec_us,
                                                            "kernel_record_ts": start_us + exec_us}]}},
    }


def line(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.fixture
def dump_dir(tmp_path) -> Path:
    d = tmp_path / "nccl-inspector-4242"
    d.mkdir()
    return d


def test_readme_record_maps_to_ncclTiming(dump_dir):
    append(dump_dir / "example-hostname-pid1639453.log", line(README_RECORD))
    collector = InspectorCollector(dump_dir)
    assert collector.is_supported() and collector.job == "4242"
    (t,) = collector.sample()
    assert t == NcclTiming(job="4242", rank=2, world_size=8, host="example-hostname", collective="AllReduce",
                           seq=1407, bytes=17179869184, ts=1748030377.748202, compute_us=0.0, collective_us=61974.0,
                           source="inspector")
    NcclTiming.model_validate_json(t.model_dump_json(), strict=True)
    assert collector.sample() == []


def test_follows_appends_new_files_and_partial_lines(dump_dir):
    a, b = dump_dir / "node-a-pid100.log", dump_dir / "node-b-pid200.log"
    collector = InspectorCollector(dump_dir, job="llama-70b")
    assert collector.sample() == []
    append(a, line(verbose(1, 1_000_000, 40_000)) + line(verbose(2, 1_050_000, 41_000))[:57])
    assert [t.seq for t in collector.sample()] == [1]  # the second line is still being written
    append(a, line(verbose(2, 1_050_000, 41_000))[57:])
    append(b, line(verbose(7, 2_000_000, 10_000, rank=5)))
    got = collector.sample()
    assert sorted((t.rank, t.seq) for t in got) == [(4, 2), (5, 7)] and {t.job for t in got} == {"llama-70b"}
    append(a, line(verbose(3, 1_100_000, 39_500)))
    assert [t.seq for t in collector.sample()] == [3]
    assert collector.counts["records"] == 4 and collector.counts["bad_json"] == 0


def test_compute_gap_from_verbose_traces(dump_dir):
    path = dump_dir / "h-pid1.log"
    records = [verbose(10, 1_000_000, 40_000), verbose(11, 1_052_000, 41_000), verbose(13, 1_200_000, 40_000),
               verbose(14, 1_250_500, 40_000), verbose(1, 1_260_000, 100, comm="0xother")]
    append(path, b"".join(line(r) for r in records))
    got = InspectorCollector(dump_dir).sample()
    assert [(t.seq, t.compute_us, t.collective_us) for t in got] == [
        (10, 0.0, 40000.0), (11, 12000.0, 41000.0),  # 1_052_000 - (1_000_000 + 40_000)
        (13, 0.0, 40000.0),  # collective 12 was not dumped: the gap is unknown
        (14, 10500.0, 40000.0), (1, 0.0, 100.0)]  # another communicator has its own chain
    assert got[1].ts == 1.052


def test_bad_lines_are_counted_and_skipped(dump_dir):
    path = dump_dir / "h-pid1.log"
    broken = dict(README_RECORD, header={"id": "x", "rank": -1, "n_ranks": 8})
    p2p = {"header": README_RECORD["header"], "metadata": README_RECORD["metadata"],
           "p2p_perf": {"p2p": "Send", "p2p_peer": 3, "p2p_sn": 9, "p2p_msg_size_bytes": 1048576,
                        "p2p_exec_time_us": 80, "p2p_timing_source": "kernel_gpu"}}
    append(path, b"{not json\n" + line({"header": {}}) + line(broken) + line(p2p) + b"\n" + line(README_RECORD))
    collector = InspectorCollector(dump_dir)
    assert [t.seq for t in collector.sample()] == [1407]
    assert collector.counts["bad_json"] == 1 and collector.counts["bad_record"] == 2
    assert collector.counts["p2p_skipped"] == 1
    with_p2p = InspectorCollector(dump_dir, include_p2p=True)
    assert [(t.collective, t.seq, t.collective_us) for t in with_p2p.sample()] == [("Send", 9, 80.0),
                                                                                   ("AllReduce", 1407, 61974.0)]


def test_truncated_or_replaced_file_is_read_again(dump_dir):
    path = dump_dir / "h-pid1.log"
    append(path, line(verbose(1, 1_000_000, 40_000)) + line(verbose(2, 1_050_000, 40_000)))
    collector = InspectorCollector(dump_dir)
    assert len(collector.sample()) == 2
    path.write_bytes(line(verbose(1, 3_000_000, 40_000)))  # a new process reused the name
    assert [t.ts for t in collector.sample()] == [3.0] and collector.counts["truncated"] == 1
    os.remove(path)
    assert collector.sample() == []
    append(path, line(verbose(5, 4_000_000, 40_000)))
    assert [t.seq for t in collector.sample()] == [5]


def test_reads_are_bounded_per_poll(dump_dir):
    path = dump_dir / "h-pid1.log"
    one = line(verbose(1, 1_000_000, 40_000))
    append(path, b"".join(line(verbose(i, 1_000_000 + i * 50_000, 40_000)) for i in range(100)))
    collector = InspectorCollector(dump_dir, max_read_bytes=len(one) * 30 + 10)
    polls = [collector.sample() for _ in range(5)]
    assert [len(p) for p in polls][-1] == 0 and all(0 < len(p) <= 31 for p in polls[:4])
    assert [t.seq for p in polls for t in p] == list(range(100))  # nothing lost or repeated at read boundaries


def test_job_falls_back_to_the_communicator(tmp_path):
    d = tmp_path / "nccl-inspector-unknown-jobid"
    d.mkdir()
    append(d / "h-pid1.jsonl", line(README_RECORD))
    (t,) = InspectorCollector(d).sample()
    assert t.job == "comm-0x7f8c496ae9f661"
    assert not InspectorCollector(tmp_path / "absent").is_supported()
