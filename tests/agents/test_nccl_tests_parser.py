"""nccl-tests output: the real 16 x H100 run, older and newer layouts, N/A checks, and property tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.nccl import BusBandwidth, busbw_factor, parse_nccl_tests, parse_nccl_tests_run


@pytest.fixture
def run_text(reference_dir: Path) -> str:
    return (reference_dir / "nccl_tests_sample.txt").read_text()


def printed_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_real_run_every_row_and_column(run_text):
    run = parse_nccl_tests_run(run_text)
    table = printed_rows(run_text)
    assert len(table) == 31 and len(run.rows) == 62 and run.skipped_lines == 0
    for cells, out, inp in zip(table, run.rows[0::2], run.rows[1::2]):
        assert (out.size_bytes, out.count, out.dtype, out.redop, out.root) == (int(cells[0]), int(cells[1]), "float",
                                                                              "sum", -1)
        assert (out.in_place, inp.in_place) == (False, True) and inp.size_bytes == out.size_bytes
        assert (out.time_us, out.algbw_gbs, out.busbw_gbs, out.wrong) == (float(cells[5]), float(cells[6]),
                                                                          float(cells[7]), int(cells[8]))
        assert (inp.time_us, inp.algbw_gbs, inp.busbw_gbs, inp.wrong) == (float(cells[9]), float(cells[10]),
                                                                          float(cells[11]), int(cells[12]))
    last = run.rows[-2]
    assert (last.size_bytes, last.time_us, last.algbw_gbs, last.busbw_gbs) == (8589934592, 47535, 180.71, 338.82)
    assert run.avg_busbw_gbs == 70.742 and run.out_of_bounds == 0 and run.check_ok is True
    assert parse_nccl_tests(run_text) == run.rows


def test_real_run_ranks_and_busbw_factor(run_text):
    run = parse_nccl_tests_run(run_text)
    assert run.n_ranks == 16 and {r.host for r in run.ranks} == {"ztan-mig-235z", "ztan-mig-gq73"}
    assert run.ranks[9].device == 1 and run.ranks[9].pci_bus_id == "0000:05:00.0"
    assert run.ranks[0].model == "NVIDIA H100 80GB HBM3" and run.ranks[15].pid == 6740
    factor = busbw_factor("AllReduce", run.n_ranks)
    assert factor == 30 / 16
    for row in run.rows:
        if row.algbw_gbs >= 1.0:  # below that the printed 2-decimal rounding dominates
            assert row.algbw_gbs * factor == pytest.approx(row.busbw_gbs, abs=0.01 * factor + 0.005)
        assert row.algbw_gbs == pytest.approx(row.size_bytes / row.time_us / 1e3, rel=0.01, abs=0.006)
    assert sum(r.busbw_gbs for r in run.rows if not r.in_place) / 31 == pytest.approx(70.742, abs=0.5)


OLD_LAYOUT = """\
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144   float     sum    58.93   17.79   31.14  5e-07    58.64   17.88   31.29  5e-07
   134217728      33554432   float     sum   1460.5   91.90  160.82  5e-07   1456.5   92.15  161.27  5e-07
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 95.8797
"""

SENDRECV_NA = """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        8192          2048     float     sum      -1    16.03    0.51    0.51      0    15.77    0.52    0.52    N/A
# Out of bounds values : 3 FAILED
"""


def test_old_layout_without_root_and_with_error_column():
    run = parse_nccl_tests_run(OLD_LAYOUT)
    assert [(r.size_bytes, r.in_place, r.busbw_gbs) for r in run.rows] == [
        (1048576, False, 31.14), (1048576, True, 31.29), (134217728, False, 160.82), (134217728, True, 161.27)]
    assert all(r.root is None and r.wrong is None and r.max_error == 5e-07 for r in run.rows)
    assert run.avg_busbw_gbs == 95.8797


def test_na_in_wrong_and_failed_check():
    run = parse_nccl_tests_run(SENDRECV_NA)
    assert [r.wrong for r in run.rows] == [0, None]
    assert run.out_of_bounds == 3 and run.check_ok is False and run.avg_busbw_gbs is None


def test_rows_without_a_header_use_the_known_layouts():
    headerless = "\n".join(line for line in OLD_LAYOUT.splitlines() if not line.startswith("#"))
    assert len(parse_nccl_tests(headerless)) == 4


def test_noise_lines_are_skipped_not_raised():
    text = SENDRECV_NA + "ztan-mig-235z: Test NCCL failure common.cu:1279 'unhandled system error'\n 12 x\n"
    run = parse_nccl_tests_run(text)
    assert len(run.rows) == 2 and run.skipped_lines == 2


@pytest.mark.parametrize("name, n, factor", [
    ("AllReduce", 8, 1.75), ("all_reduce_perf", 2, 1.0), ("ReduceScatter", 8, 0.875), ("AllGather", 16, 15 / 16),
    ("AlltoAll", 4, 0.75), ("Broadcast", 8, 1.0), ("SendRecv", 8, 1.0), ("Reduce", 8, 1.0)])
def test_busbw_factors(name, n, factor):
    assert busbw_factor(name, n) == pytest.approx(factor)


@settings(max_examples=400)
@given(st.text(max_size=600))
def test_arbitrary_text_never_crashes(text):
    run = parse_nccl_tests_run(text)
    assert all(isinstance(r, BusBandwidth) for r in run.rows)


def _time(us: float) -> str:
    """nccl-tests' time format: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


_half = st.tuples(st.floats(min_value=0.01, max_value=1e6), st.floats(min_value=0, max_value=999),
                  st.floats(min_value=0, max_value=999), st.one_of(st.integers(0, 10**9), st.just("N/A")))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**38), st.sampled_from(["float", "half", "bfloat16"]),
                          st.sampled_from(["sum", "none", "max"]), st.integers(-1, 64), _half, _half),
                min_size=1, max_size=20),
       st.floats(min_value=0, max_value=1000))
def test_generated_tables_parse_back(rows, avg):
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20",
             "#  Rank  0 Group  0 Pid   6899 on node-a device  0 [0000:04:00] NVIDIA H200",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
             "   busbw #wrong"]
    for size, count, dtype, redop, root, *halves in rows:
        line = f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:6d}"
        for time_us, algbw, busbw, wrong in halves:
            wrong_text = "N/A" if wrong == "N/A" else f"{float(wrong):g}"
            line += f"  {_time(time_us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong_text:>5s}"
        lines.append(line)
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.3f} "]
    run = parse_nccl_tests_run("\n".join(lines) + "\n")
    assert run.skipped_lines == 0 and len(run.rows) == 2 * len(rows) and run.n_ranks == 1
    assert run.avg_busbw_gbs == pytest.approx(round(avg, 3))
    for (size, count, dtype, redop, root, *halves), out, inp in zip(rows, run.rows[0::2], run.rows[1::2]):
        for parsed, (time_us, algbw, busbw, wrong) in ((out, halves[0]), (inp, halves[1])):
            assert (parsed.size_bytes, parsed.count, parsed.dtype, parsed.redop, parsed.root) == (
                size, count, dtype, redop, root)
            assert parsed.time_us == float(_time(time_us)) and parsed.algbw_gbs == float(f"{algbw:.2f}")
            assert parsed.busbw_gbs == float(f"{busbw:.2f}")
            assert parsed.wrong == (None if wrong == "N/A" else int(float(f"{float(wrong):g}")))

