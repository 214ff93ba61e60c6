"""Parser for nccl-tests output (all_reduce_perf & co): the bandwidth table, the ranks, and the summary footer. The
agent's NCCL collector reads it, and so does a remediation bot that validates a node with an nccl-tests run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from schemas.pci import normalize_pci

TIME_COLUMNS = ("time", "cputime")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                   r"\s+\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)\s*(\S*)", re.IGNORECASE)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\S*)")
# Column layouts printed by nccl-tests when no header line is found: current (with root) and pre-2019 (no root).
_LAYOUTS = {
    13: ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 2,
    12: ["size", "count", "type", "redop"] + ["time", "algbw", "busbw", "error"] * 2,
}


@dataclass(frozen=True)
class BusBandwidth:
    """One measurement: a message size, out-of-place or in-place, as one half of a table row."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    in_place: bool
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None  # '#wrong' elements; None when the build printed N/A (unchecked) or an 'error' column
    max_error: float | None = None  # older builds' 'error' column (max deviation) instead of '#wrong'


@dataclass(frozen=True)
class RankInfo:
    rank: int
    pid: int
    host: str
    device: int
    pci_bus_id: str
    model: str


@dataclass
class NcclTestsRun:
    """Everything one run printed: rows, ranks, and the footer's average bus bandwidth and data check."""

    rows: list[BusBandwidth] = field(default_factory=list)
    ranks: list[RankInfo] = field(default_factory=list)
    avg_busbw_gbs: float | None = None
    out_of_bounds: int | None = None
    check_ok: bool | None = None  # the footer's OK / FAILED verdict, where printed
    skipped_lines: int = 0

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)


def busbw_factor(collective: str, n_ranks: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md): 2(n-1)/n for AllReduce, (n-1)/n for the all-to-all family."""
    name = collective.lower().replace("_", "").removesuffix("perf")
    if name == "allreduce":
        return 2.0 * (n_ranks - 1) / n_ranks
    if name in ("reducescatter", "allgather", "alltoall"):
        return (n_ranks - 1) / n_ranks
    return 1.0  # broadcast, reduce, sendrecv, gather, scatter


def _number(token: str) -> float:
    value = float(token)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(token)
    return value


def _header(line: str) -> list[str] | None:
    tokens = line.lstrip("#").split()
    if "algbw" in tokens and "busbw" in tokens and "size" in tokens and any(t in TIME_COLUMNS for t in tokens):
        return tokens
    return None


def _row(tokens: list[str], columns: list[str]) -> list[BusBandwidth]:
    starts = [i for i, c in enumerate(columns) if c in TIME_COLUMNS]
    ident = dict(zip(columns[:starts[0]], tokens[:starts[0]]))
    size, count = int(ident["size"]), int(ident["count"])
    if size < 0 or count < 0:
        raise ValueError("negative size")
    root = int(ident["root"]) if "root" in ident else None
    out = []
    for group, start in enumerate(starts):
        end = starts[group + 1] if group + 1 < len(starts) else len(columns)
        cells = dict(zip(columns[start:end], tokens[start:end]))
        wrong_text = cells.get("#wrong")
        wrong = None if wrong_text in (None, "N/A") else int(_number(wrong_text))
        error = _number(cells["error"]) if "error" in cells else None
        out.append(BusBandwidth(size, count, ident.get("type", ""), ident.get("redop", ""), root, group == 1,
                                _number(cells[columns[start]]), _number(cells["algbw"]), _number(cells["busbw"]),
                                wrong, error))
    return out


def parse_nccl_tests_run(text: str) -> NcclTestsRun:
    """Parse a whole run; lines that fit no known shape are counted in `skipped_lines`, never raised."""
    run = NcclTestsRun()
    columns: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            columns = _header(stripped) or columns
            if m := _RANK.match(stripped):
                run.ranks.append(RankInfo(int(m[1]), int(m[2]), m[3], int(m[4]), _bus_id(m[5]),
                                          m[6].strip()))
            elif m := _AVG.match(stripped):
                try:
                    run.avg_busbw_gbs = _number(m[1])
                except ValueError:
                    run.skipped_lines += 1
            elif m := _OOB.match(stripped):
                run.out_of_bounds = int(m[1])
                run.check_ok = {"OK": True, "FAILED": False}.get(m[2].upper())
            continue
        tokens = stripped.split()
        layout = columns if columns is not None and len(columns) == len(tokens) else _LAYOUTS.get(len(tokens))
        if layout is None or not tokens[0].isdigit():
            run.skipped_lines += 1
            continue
        try:
            run.rows.extend(_row(tokens, layout))
        except (ValueError, KeyError, IndexError):
            run.skipped_lines += 1
    return run


def parse_nccl_tests(text: str) -> list[BusBandwidth]:
    """Every measurement of an nccl-tests run, out-of-place then in-place for each size, in printed order."""
    return parse_nccl_tests_run(text).rows


def _bus_id(text: str) -> str:
    """The rank line's bus id in the wire's spelling where it is a full PCI id; older builds print only '0x1b'."""
    try:
        return normalize_pci(text) if text.count(":") == 2 else text.strip().lower()
    except ValueError:
        return text.strip().lower()
