"""InspectorCollector: follows an NCCL Inspector dump directory (JSON lines per process) into NcclTiming records."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from schemas.events import NcclTiming

PATTERNS = ("*.log", "*.jsonl")  # the plugin writes <dump dir>/<hostname>-pid<pid>.log
_JOB_DIR = re.compile(r"^nccl-inspector-(?!unknown-jobid$)(.+)$")


@dataclass
class _Followed:
    """Where we are in one dump file, and the last collective seen per communicator (for compute gaps)."""

    inode: int
    offset: int = 0
    partial: bytes = b""
    last: dict[str, tuple[int, float | None, float]] = field(default_factory=dict)  # comm -> (sn, start_us, exec_us)


class InspectorCollector:
    """Each `sample()` returns the records appended since the last one, across existing and new files.

    A trailing line without its newline is kept until the writer finishes it; a file that shrinks or is replaced
    is read again from the start. `job` names the job; without it the dump directory's `nccl-inspector-<slurm id>`
    name is used, then the communicator id. `compute_us` is the gap since the same communicator's previous
    collective on this rank, known only when the plugin dumps in verbose mode (event_trace_ts) and no collective
    was skipped between the two records; otherwise 0.
    """

    name = "nccl_inspector"

    def __init__(self, dump_dir: str | Path, *, job: str | None = None, include_p2p: bool = False,
                 max_read_bytes: int = 8 << 20, max_line_bytes: int = 1 << 20):
        self.dump_dir = Path(dump_dir)
        dir_job = _JOB_DIR.match(self.dump_dir.name)
        self.job = job or (dir_job[1] if dir_job else None)
        self.include_p2p, self.max_read_bytes, self.max_line_bytes = include_p2p, max_read_bytes, max_line_bytes
        self.counts: Counter[str] = Counter()  # records, bad_json, bad_record, p2p_skipped, long_line, truncated
        self._files: dict[Path, _Followed] = {}

    def is_supported(self) -> bool:
        return self.dump_dir.is_dir()

    def sample(self) -> list[NcclTiming]:
        out: list[NcclTiming] = []
        present = {p for pattern in PATTERNS for p in self.dump_dir.glob(pattern) if p.is_file()}
        for gone in set(self._files) - present:
            del self._files[gone]
        for path in sorted(present):
            for line in self._new_lines(path):
                record = self._record(line, self._files[path])
                if record is not None:
                    out.append(record)
        self.counts["records"] += len(out)
        return out

    def _new_lines(self, path: Path) -> list[bytes]:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                state = self._files.get(path)
                if state is None or state.inode != st.st_ino or st.st_size < state.offset:
                    if state is not None:
                        self.counts["truncated"] += 1
                    state = self._files[path] = _Followed(st.st_ino)
                f.seek(state.offset)
                data = f.read(self.max_read_bytes)
        except OSError:
            self._files.pop(path, None)  # vanished between glob and open; seen again if it comes back
            return []
        state.offset += len(data)
        lines = (state.partial + data).split(b"\n")
        state.partial = lines.pop()
        if len(state.partial) > self.max_line_bytes:
            self.counts["long_line"] += 1
            state.partial = b""
        return [line for line in lines if line.strip()]

    def _record(self, line: bytes, state: _Followed) -> NcclTiming | None:
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.counts["bad_json"] += 1
            return None
        try:
            return self._timing(doc, state)
        except (KeyError, TypeError, ValueError, AttributeError):  # ValidationError is a ValueError
            self.counts["bad_record"] += 1
            return None

    def _timing(self, doc: dict, state: _Followed) -> NcclTiming | None:
        header, meta = doc["header"], doc["metadata"]
        comm = str(header["id"])
        perf, p2p = doc.get("coll_perf"), doc.get("p2p_perf")
        if perf is None:
            if p2p is None or not self.include_p2p:
                self.counts["p2p_skipped" if p2p is not None else "bad_record"] += 1
                return None
            op, sn, size, exec_us = p2p["p2p"], int(p2p["p2p_sn"]), int(p2p["p2p_msg_size_bytes"]), \
                float(p2p["p2p_exec_time_us"])
            start_us, compute_us = None, 0.0
        else:
            op, sn, size, exec_us = perf["coll"], int(perf["coll_sn"]), int(perf["coll_msg_size_bytes"]), \
                float(perf["coll_exec_time_us"])
            trace = perf.get("event_trace_ts") or {}
            start_us = float(trace["coll_start_ts"]) if trace.get("coll_start_ts") else None
            compute_us = 0.0
            previous = state.last.get(comm)
            if previous is not None and start_us is not None and previous[1] is not None and previous[0] == sn - 1:
                compute_us = max(0.0, start_us - (previous[1] + previous[2]))
            state.last[comm] = (sn, start_us, exec_us)
        ts_us = start_us if start_us is not None else float(meta["dump_timestamp_us"])
        return NcclTiming.model_validate({
            "job": self.job or f"comm-{comm}", "rank": int(header["rank"]), "world_size": int(header["n_ranks"]),
            "host": meta["hostname"], "collective": op, "seq": sn, "bytes": size, "ts": ts_us / 1e6,
            "compute_us": compute_us, "collective_us": exec_us, "source": "inspector"})

    def close(self) -> None:
        self._files.clear()
