"""Per-job straggler window state: per-rank sums and counts per window, arrival lateness per collective, JSON form."""

from __future__ import annotations

import base64
import math
from copy import deepcopy
from dataclasses import dataclass, field

import numpy as np


SUMS = ("n_c", "sum_c", "n_w", "sum_w", "n_l", "sum_l")  # compute, wait inside the collective, arrival lateness
# Sums are whole nanoseconds in float64: exact below 2**53 ns (104 days a rank a window), so they do not depend on the
# order of the additions, and a window scores the same however its timings were cut into batches.
NS_PER_US = 1e3


@dataclass
class Batch:
    """Columns of one job's checked timings, in arrival order."""

    world_size: int
    rank: np.ndarray
    seq: np.ndarray
    ts: np.ndarray
    compute_us: np.ndarray
    wait_us: np.ndarray
    gpu: np.ndarray  # -1 = unknown
    host: list[str]

    @classmethod
    def of(cls, steps: list[dict]) -> Batch:
        """Columns of one job's checked NcclStep records (a host's ranks around one collective each), rank by rank;
        records of an older world size than the newest record's are left out."""
        world = steps[-1]["world_size"]
        rank, seq, ts, compute, wait, gpu, host = [], [], [], [], [], [], []
        for step in steps:
            if step["world_size"] != world:
                continue
            n, h = step["seq"], step["host"]
            for r in step["ranks"]:
                rank.append(r["rank"])
                seq.append(n)
                ts.append(r["ts"])
                compute.append(r["compute_us"])
                wait.append(r["collective_us"])
                g = r.get("gpu_index")
                gpu.append(-1 if g is None else g)
                host.append(h)
        return cls(world, np.array(rank, np.int64), np.array(seq, np.int64), np.array(ts, float),
                   np.array(compute, float), np.array(wait, float), np.array(gpu, np.int64), host)


@dataclass
class Window:
    """One window's per-rank sums and counts, and (seq, first arrival) bounds that give the collective period."""

    n_c: np.ndarray
    sum_c: np.ndarray
    n_w: np.ndarray
    sum_w: np.ndarray
    n_l: np.ndarray
    sum_l: np.ndarray
    records: int = 0
    with_compute: int = 0
    period: list[float] = field(default_factory=lambda: [-1.0, 0.0, -1.0, 0.0])  # seq_lo, t_lo, seq_hi, t_hi

    @classmethod
    def empty(cls, world: int) -> Window:
        return cls(*(np.zeros(world) for _ in SUMS))

    def add_seq(self, seq: int, t0: float) -> None:
        lo, _, hi, _ = self.period
        if lo < 0 or seq < lo:
            self.period[0:2] = [seq, t0]
        if hi < 0 or seq > hi:
            self.period[2:4] = [seq, t0]

    def period_us(self) -> float:
        """Median-free estimate of the time between consecutive collectives (first arrivals), NaN if unknown."""
        lo, t_lo, hi, t_hi = self.period
        return (t_hi - t_lo) / (hi - lo) * 1e6 if hi > lo >= 0 else math.nan


@dataclass
class JobState:
    """Everything one job needs between batches; per-rank arrays have length world_size."""

    job: str
    world_size: int
    window_s: float  # the grid its windows and history are kept on (a checkpoint before v3: 30 s)
    hosts: list[str] = field(default_factory=list)
    host_of: np.ndarray = None  # index into hosts, -1 unknown
    gpu_of: np.ndarray = None
    last_ts: np.ndarray = None  # newest timing applied per rank: replays and duplicates are dropped
    hits: np.ndarray = None  # bit i: the rank was slow in the i-th newest scored window
    seen: np.ndarray = None  # bit i: the rank had enough timings in the i-th newest scored window
    flagged: np.ndarray = None
    since: np.ndarray = None  # start of the window in which the flag was raised
    wm: float = 0.0  # newest timing ts of the job
    closed: int | None = None  # newest closed window index
    windows: dict[int, Window] = field(default_factory=dict)
    pending: dict[int, np.ndarray] = field(default_factory=dict)  # seq -> arrival ts per rank, NaN not yet
    folded_hi: int = -1
    scored: int = 0
    checkpoint_wm: float = 0.0
    partition: int | None = None  # of the job's records: where its changelog record (and tombstone) goes

    def __post_init__(self):
        n = self.world_size
        defaults = dict(host_of=np.full(n, -1, np.int32), gpu_of=np.full(n, -1, np.int16),
                        last_ts=np.full(n, -np.inf), hits=np.zeros(n, np.uint16), seen=np.zeros(n, np.uint16),
                        flagged=np.zeros(n, bool), since=np.full(n, np.nan))
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def ingest(self, b: Batch, window_s: float) -> tuple[int, int]:
        """Fold a batch into the open windows and pending collectives; returns (duplicates, too late) dropped."""
        order = np.lexsort((b.ts, b.rank))
        r, t = b.rank[order], b.ts[order]
        repeat = np.zeros(r.size, bool)
        repeat[1:] = (r[1:] == r[:-1]) & (t[1:] == t[:-1])
        fresh = np.zeros(r.size, bool)
        fresh[order] = ~repeat & (t > self.last_ts[r])
        dups = int(r.size - fresh.sum())
        np.maximum.at(self.last_ts, b.rank[fresh], b.ts[fresh])
        self._place(b, fresh)
        w = np.floor(b.ts / window_s).astype(np.int64)
        keep = fresh & (w > (-(2**62) if self.closed is None else self.closed))
        late = int(fresh.sum() - keep.sum())
        if keep.any():
            self.wm = max(self.wm, float(b.ts[keep].max()))
            if self.closed is None:
                self.closed = int(w[keep].min()) - 1
        n = self.world_size
        for win in np.unique(w[keep]).tolist():
            sel = keep & (w == win)
            acc = self.windows.setdefault(win, Window.empty(n))
            rr, c, x = b.rank[sel], b.compute_us[sel], b.wait_us[sel]
            acc.n_c += np.bincount(rr[c > 0], minlength=n)
            acc.sum_c += np.bincount(rr[c > 0], weights=np.round(c[c > 0] * NS_PER_US), minlength=n)
            acc.n_w += np.bincount(rr[x > 0], minlength=n)
            acc.sum_w += np.bincount(rr[x > 0], weights=np.round(x[x > 0] * NS_PER_US), minlength=n)
            acc.records += int(sel.sum())
            acc.with_compute += int((c > 0).sum())
        for s in np.unique(b.seq[keep]).tolist():
            if s <= self.folded_hi and s not in self.pending:
                continue  # that collective's lateness was already folded
            sel = keep & (b.seq == s)
            self.pending.setdefault(s, np.full(n, np.nan))[b.rank[sel]] = b.ts[sel]
        return dups, late

    def _place(self, b: Batch, sel: np.ndarray) -> None:
        index = {h: i for i, h in enumerate(self.hosts)}
        for i in np.flatnonzero(sel).tolist():
            h = b.host[i]
            if h not in index:
                index[h] = len(self.hosts)
                self.hosts.append(h)
            self.host_of[b.rank[i]] = index[h]
        self.gpu_of[b.rank[sel]] = b.gpu[sel]

    def fold(self, window_s: float, grace_s: float, max_pending: int, before: float = -math.inf) -> None:
        """Turn collectives every rank reached (or that timed out, or start before `before`) into lateness."""
        oldest = sorted(self.pending)
        for i, s in enumerate(oldest):
            ts = self.pending[s]
            present = ~np.isnan(ts)
            t0 = float(ts[present].min())
            if not (present.all() or float(ts[present].max()) + grace_s <= self.wm or t0 < before
                    or len(oldest) - i > max_pending):
                continue
            del self.pending[s]
            self.folded_hi = max(self.folded_hi, s)
            win = math.floor(t0 / window_s)
            if present.sum() < 2 or (self.closed is not None and win <= self.closed):
                continue
            acc = self.windows.setdefault(win, Window.empty(self.world_size))
            acc.n_l += present
            acc.sum_l += np.where(present, np.round((ts - t0) * 1e6 * NS_PER_US), 0.0)
            acc.add_seq(s, t0)

    def due(self, window_s: float, grace_s: float) -> list[int]:
        """Open windows whose end plus grace the job's newest timing has passed, oldest first."""
        return [w for w in sorted(self.windows) if (w + 1) * window_s + grace_s <= self.wm]

    def copy(self) -> JobState:
        return deepcopy(self)

    def to_json(self) -> dict:
        arrays = {k: _b64(getattr(self, k)) for k in ("host_of", "gpu_of", "last_ts", "hits", "seen", "flagged",
                                                       "since")}
        return {"v": 3, "job": self.job, "world_size": self.world_size, "window_s": self.window_s, "hosts": self.hosts,
                **arrays, "wm": self.wm,
                "closed": self.closed, "folded_hi": self.folded_hi, "scored": self.scored,
                "checkpoint_wm": self.checkpoint_wm, "p": self.partition,
                "windows": {str(w): {**{k: _b64(_counts(getattr(a, k)) if k[0] == "n" else getattr(a, k))
                                        for k in SUMS}, "records": a.records,
                                     "with_compute": a.with_compute, "period": a.period}
                            for w, a in self.windows.items()},
                "pending": {str(s): _b64(ts) for s, ts in self.pending.items()}}

    @classmethod
    def from_json(cls, raw: dict) -> JobState:
        arrays = {k: _arr(raw[k], v) for k, v in (("host_of", np.int32), ("gpu_of", np.int16), ("last_ts", float),
                                                   ("hits", np.uint16), ("seen", np.uint16), ("flagged", bool),
                                                   ("since", float))}
        # v1 kept its sums in microseconds
        scale = {k: NS_PER_US if k[0] == "s" and raw.get("v", 1) < 2 else 1.0 for k in SUMS}
        windows = {int(w): Window(*(np.round(_arr(a[k], float) * scale[k]) if k[0] == "s" else
                                    _arr(a[k], np.uint32).astype(float) for k in SUMS),
                                  a["records"], a["with_compute"],
                                  list(a["period"])) for w, a in raw["windows"].items()}
        return cls(raw["job"], raw["world_size"], raw.get("window_s", 30.0), list(raw["hosts"]), **arrays, wm=raw["wm"],
                   closed=raw["closed"],
                   windows=windows, pending={int(s): _arr(v, float) for s, v in raw["pending"].items()},
                   folded_hi=raw["folded_hi"], scored=raw["scored"], checkpoint_wm=raw["checkpoint_wm"],
                   partition=raw.get("p"))


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()).decode()


def _counts(a: np.ndarray) -> np.ndarray:
    return np.minimum(a, 2**32 - 1).astype(np.uint32)


def _arr(s: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
