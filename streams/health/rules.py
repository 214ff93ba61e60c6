"""Health score per GPU and per node: hard gates and weighted penalties, always with the reasons behind them."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from schemas.analytics import HealthScore, Penalty
from schemas.limits import MAX_GPUS

HARD_BITS = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW thermal, HW thermal, HW power brake (REFERENCE.md 4)
SW_POWER_CAP = 0x4
GATING_BINS = ("reset", "reboot", "inspect", "replace")
SUSPECT = "suspect"  # a fault asking for a drain after the node's job (mode after_jobs): points, never a gate
RECOVERY = {1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset", 5: "recover_imex_domain",
            6: "bus_reset", 7: "system_reboot"}  # nvmlDeviceGpuRecoveryAction_t (REFERENCE.md 2a)
# Reading fields, in matrix column order; bools become 0/1, None NaN.
FIELDS = ("gpu_temp_c", "slowdown_temp_c", "hbm_temp_c", "hbm_max_op_temp_c", "throttle_reasons", "ecc_sbe_volatile",
          "ecc_sbe_aggregate", "ecc_dbe_volatile", "ecc_dbe_aggregate", "pcie_replay_count", "nvlink_crc_errors",
          "nvlink_replay_errors", "nvlink_recovery_errors", "row_remap_pending", "row_remap_failure",
          "retired_pages_pending", "recovery_action")
F = {n: i for i, n in enumerate(FIELDS)}
# Per-GPU state vector: last reading time, latest temperatures and limits, throttle shares (EWMA), counters and
# their rates (EWMA, per second), when a new double-bit error was last seen, latest gate flags.
COLS = ("ts", "temp", "slow", "hbm", "hbm_max", "hard", "cap", "sbe", "sbe_r", "pcie", "pcie_r", "nvl", "nvl_r",
        "dbe", "dbe_a", "dbe_at", "pending", "failure", "pages", "action")
C = {n: i for i, n in enumerate(COLS)}
NAMES = ("thermal_headroom", "throttle_share", "ecc_sbe_rate", "pcie_replay_rate", "nvlink_error_rate",
         "straggler_slowdown", "fault_history")
WEIGHTS = dict(zip(NAMES, (25.0, 20.0, 10.0, 10.0, 10.0, 50.0, 20.0)))
# Where each penalty takes its full weight: C of headroom to the GPU's own slowdown limit (none from 10 C up);
# share of time throttled; corrected ECC per hour (log scale; GCM's hard limit is 50M volatile); PCIe replays/min
# (DCGM's health-watch limit, the RM maximum); NVLink errors/s (a tenth of DCGM's 100 CRC/s failure rate);
# straggler slowdown in %; fault-history points.
FULL_AT = dict(zip(NAMES, (10.0, 0.5, 10_000.0, 8.0, 10.0, 20.0, 20.0)))


class HealthConfig(BaseModel):
    """Weights and scales [ours, ALGORITHMS.md 4.3]: H = 100 - sum w_i * min(1, p_i), capped when a gate fires."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate_cap: float = Field(default=20.0, ge=0, le=100, description="score ceiling while any hard gate fires")
    emit_delta: float = Field(default=2.0, ge=0, description="a score is news when it moved this much")
    heartbeat_s: float = Field(default=60.0, gt=0, description="every node's score at least this often")
    max_gap_s: float = Field(default=120.0, gt=0, description="longest reading gap an EWMA step spans")
    weights: dict[str, float] = Field(default_factory=lambda: dict(WEIGHTS))
    full_at: dict[str, float] = Field(default_factory=lambda: dict(FULL_AT))
    hbm_margin_c: float = 5.0  # thermal headroom against the HBM max operating temperature, full at it
    throttle_tau_s: float = 300.0  # the EWMA "window" of throttle time
    power_cap_factor: float = 0.5  # SW power cap is policy as often as trouble: it counts half
    rate_tau_s: float = 300.0  # the EWMA window of counter rates
    nvlink_recovery_factor: float = 100.0  # one link recovery counts as 100 CRC errors
    straggler_ttl_s: float = 300.0  # a flag not refreshed for this long no longer counts
    history_window_s: float = 86_400.0
    history_half_life_s: float = 6 * 3600.0
    bin_points: dict[str, float] = Field(default_factory=lambda: {
        "ignore": 0.0, "retry": 2.0, "reset": 8.0, "reboot": 8.0, "inspect": 8.0, "replace": 10.0, SUSPECT: 8.0})
    software_cap: float = Field(default=10.0, description="retry/ignore faults never cost more (they must not drain)")
    fault_gate_max_s: float = Field(default=6 * 3600.0, description="a gating fault no repair followed stops gating")
    faults_kept: int = 64
    throttle_clock_loss: float = 0.3  # usable compute: share of speed lost while hard-throttled [ours]
    power_cap_clock_loss: float = 0.1


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _nan_row() -> list:
    return [math.nan] * len(COLS)


_NAN_ROW = _nan_row()  # read-only
_EMPTY = np.empty((0, len(COLS)))
_TS = C["ts"]
_IDENTITY = [list(range(n)) for n in range(MAX_GPUS + 1)]  # GPU indices 0..n-1 in order: rows as they are
_reading = operator.itemgetter(*FIELDS)
_index = operator.itemgetter("index")
_NO_GATES: list[str] = []  # a GPU row's gates when none fired: shared by every such row, so never changed
_LATEST_COLS = (("temp", "gpu_temp_c"), ("slow", "slowdown_temp_c"), ("hbm", "hbm_temp_c"),
                ("hbm_max", "hbm_max_op_temp_c"), ("pending", "row_remap_pending"), ("failure", "row_remap_failure"),
                ("pages", "retired_pages_pending"), ("action", "recovery_action"))
_LATEST, _LATEST_FROM = [C[c] for c, _ in _LATEST_COLS], [F[f] for _, f in _LATEST_COLS]


@dataclass
class HostHealth:
    """Everything the score of one host needs, JSON-able for the changelog."""

    wm: float = 0.0
    rack: str = ""
    installed: int = 0
    present: list[int] = field(default_factory=list)
    # Per-GPU state vectors (COLS), row i for GPU i, NaN for a GPU never seen. Replaced by each fold, never changed in
    # place, so copies share it.
    rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    since: dict[str, float] = field(default_factory=dict)  # gate key -> onset
    faults: list[list] = field(default_factory=list)  # [fault_id, first_ts, last_ts, gpu (-1 node), code, bin, count]
    stragglers: dict[int, list] = field(default_factory=dict)  # gpu (-1 node) -> [ts, slowdown_pct, z, job]
    repaired_at: float = 0.0
    emitted: dict[str, list] = field(default_factory=dict)  # "node" -> [score, gates, ts]; "<gpu>" -> [score, gates]
    job: str | None = None  # the job the host's newest sample names
    told_job: str | None = None  # the job the last published node row named
    # `emitted`'s GPU scores as an array (NaN: none yet) and whether any GPU row went out with gates; built when
    # first read, dropped whenever `emitted` changes (see sent()). Not serialised.
    sent_cache: tuple[np.ndarray, bool] | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HostHealth):
            return NotImplemented
        return orjson.dumps(self.to_json()) == orjson.dumps(other.to_json())  # NaN (unknown) equals NaN: both null

    def to_json(self) -> dict:
        # Unknown values stay NaN: the changelog's JSON encoder (orjson) writes null.
        gpus = {str(i): r for i, r in enumerate(self.rows.tolist()) if r[_TS] == r[_TS]}  # seen: a reading time
        return {"wm": self.wm, "rack": self.rack, "installed": self.installed, "present": self.present,
                "gpus": gpus, "since": self.since, "faults": self.faults,
                "stragglers": {str(i): v for i, v in self.stragglers.items()}, "repaired_at": self.repaired_at,
                "emitted": self.emitted, "job": self.job, "told_job": self.told_job}

    def copy(self) -> HostHealth:
        """A copy a step may change; the two share `rows` and the `emitted` entries (replaced, never changed)."""
        return HostHealth(self.wm, self.rack, self.installed, list(self.present), self.rows, dict(self.since),
                          [list(f) for f in self.faults], {i: list(v) for i, v in self.stragglers.items()},
                          self.repaired_at, dict(self.emitted), self.job, self.told_job, self.sent_cache)

    def sent(self, n: int) -> tuple[np.ndarray, bool]:
        """The last published score of GPUs 0..n-1 (NaN: never published) and whether any published GPU row had
        gates, from `emitted`; whoever changes `emitted` sets sent_cache to None."""
        if self.sent_cache is None:
            gpus = {int(k): v for k, v in self.emitted.items() if k != "node"}
            scores = np.full(max(n, self.installed, max(gpus, default=-1) + 1), math.nan)
            for i, (score, _) in gpus.items():
                scores[i] = score
            self.sent_cache = (scores, any(g for _, g in gpus.values()))
        scores, gated = self.sent_cache
        return (scores if len(scores) >= n else np.concatenate([scores, np.full(n - len(scores), math.nan)])), gated

    @classmethod
    def from_json(cls, raw: Mapping | None) -> HostHealth:
        if not raw:
            return cls()
        rows = _EMPTY
        if raw["gpus"]:
            rows = np.full((max(int(i) for i in raw["gpus"]) + 1, len(COLS)), math.nan)
            for i, r in raw["gpus"].items():
                rows[int(i)] = [_num(x) for x in r]
        return cls(raw["wm"], raw["rack"], raw["installed"], list(raw["present"]), rows, dict(raw["since"]),
                   [list(f) for f in raw["faults"]], {int(i): list(v) for i, v in raw["stragglers"].items()},
                   raw["repaired_at"], {k: list(v) for k, v in raw["emitted"].items()}, raw.get("job"),
                   raw.get("told_job"))  # .get: states written before jobs were kept


def apply_sample(h: HostHealth, s: dict, cfg: HealthConfig) -> bool:
    """Fold one host sample into the host's state; False if it is a replay or stale."""
    return apply_samples([(h, s)], cfg)[0]


def apply_samples(pairs: Sequence[tuple[HostHealth, dict]], cfg: HealthConfig) -> list[bool]:
    """Fold samples into their hosts' states, vectorised over every GPU of every host at once; a host's samples fold
    in their order (a host seen k times takes k rounds). Per pair: False if it was a replay or stale."""
    out = [False] * len(pairs)
    rounds: list[list[int]] = []
    seen: dict[int, int] = {}
    for k, (h, _) in enumerate(pairs):
        r = seen.get(id(h), 0)
        seen[id(h)] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(k)
    for ks in rounds:
        live = [k for k in ks if float(pairs[k][1]["ts"]) > pairs[k][0].wm]
        if live:
            _fold([pairs[k] for k in live], cfg)
            for k in live:
                out[k] = True
    return out


def _rows(h: HostHealth, idx: list[int]) -> np.ndarray:
    """The host's state rows of GPUs `idx` as a matrix (NaN for a GPU never seen); read it, do not change it."""
    rows = h.rows
    if len(idx) <= len(rows) and (idx is _IDENTITY[len(idx)] or idx == _IDENTITY[len(idx)]):
        return rows[:len(idx)]
    return _grown(rows, max(idx, default=-1) + 1)[idx]


def _grown(rows: np.ndarray, n: int) -> np.ndarray:
    """`rows` with NaN rows added up to n rows (itself when it has them)."""
    if len(rows) >= n:
        return rows
    out = np.full((n, len(COLS)), math.nan)
    out[:len(rows)] = rows
    return out


def _fold(pairs: Sequence[tuple[HostHealth, dict]], cfg: HealthConfig) -> None:
    """One round: each host at most once, each sample newer than its host's watermark."""
    readings, prior, indices, counts = [], [], [], []
    for h, s in pairs:
        gpus = s["gpus"]
        idx = list(map(_index, gpus))
        try:
            readings += list(map(_reading, gpus))
        except KeyError:  # a reading that leaves optional fields out
            readings += [[g.get(f) for f in FIELDS] for g in gpus]
        prior.append(_rows(h, idx))
        indices.append(idx)
        counts.append(len(idx))
    m = np.array(readings, dtype=float).reshape(len(readings), len(FIELDS))  # None: NaN
    p = np.concatenate(prior) if prior else np.empty((0, len(COLS)))
    stamps = [float(s["ts"]) for _, s in pairs]
    ts = np.repeat(np.array(stamps, dtype=float), counts)
    n = p.copy()
    dt = ts - p[:, C["ts"]]
    seen = np.isfinite(dt) & (dt > 0)
    dt_ok = np.where(seen, dt, 1.0)
    step = np.minimum(dt_ok, cfg.max_gap_s)

    def ewma(col: str, x: np.ndarray, tau: float) -> None:
        w = np.where(seen, 1.0 - np.exp(-step / tau), 0.0)
        old = _z(p[:, C[col]])
        n[:, C[col]] = np.where(np.isfinite(x), old * (1.0 - w) + _z(x) * w, old)

    bits = m[:, F["throttle_reasons"]]
    known = np.isfinite(bits)
    b = np.where(known, bits, 0).astype(np.int64)
    ewma("hard", np.where(known, (b & HARD_BITS) != 0, np.nan), cfg.throttle_tau_s)
    ewma("cap", np.where(known, ((b & SW_POWER_CAP) != 0) & ((b & HARD_BITS) == 0), np.nan), cfg.throttle_tau_s)
    sbe = np.where(np.isfinite(m[:, F["ecc_sbe_volatile"]]), m[:, F["ecc_sbe_volatile"]], m[:, F["ecc_sbe_aggregate"]])
    links = m[:, [F["nvlink_crc_errors"], F["nvlink_replay_errors"], F["nvlink_recovery_errors"]]]
    links = links * np.array([1.0, 1.0, cfg.nvlink_recovery_factor])
    with np.errstate(invalid="ignore"):
        nvl = np.where(np.isfinite(links).any(axis=1), np.nansum(links, axis=1), np.nan)  # what the GPU can report
    for col, cur in (("sbe", sbe), ("pcie", m[:, F["pcie_replay_count"]]), ("nvl", nvl)):
        delta = cur - p[:, C[col]]
        delta = np.where(delta < 0, 0.0, delta)  # a counter that went back was reset (driver reload): new baseline
        ewma(col + "_r", np.where(np.isfinite(delta), delta / dt_ok, np.nan), cfg.rate_tau_s)
        n[:, C[col]] = np.where(np.isfinite(cur), cur, p[:, C[col]])
    new_dbe = np.zeros(len(ts), dtype=bool)
    for col, f in (("dbe", "ecc_dbe_volatile"), ("dbe_a", "ecc_dbe_aggregate")):
        cur = m[:, F[f]]
        with np.errstate(invalid="ignore"):
            new_dbe |= cur > p[:, C[col]]
        n[:, C[col]] = np.where(np.isfinite(cur), cur, p[:, C[col]])
    n[:, C["dbe_at"]] = np.where(new_dbe, ts, p[:, C["dbe_at"]])
    n[:, _LATEST] = m[:, _LATEST_FROM]  # latest reading: an unreadable value is unknown now, not what it was
    n[:, C["ts"]] = ts
    hits = row_gates(n, np.repeat([h.repaired_at for h, _ in pairs], counts), ts, cfg)
    j = 0
    for (h, s), idx, ts_h in zip(pairs, indices, stamps):
        k = j + len(idx)
        if len(idx) >= len(h.rows) and idx == _IDENTITY[len(idx)]:  # GPUs 0..n-1, as nearly every sample has them
            h.rows = n[j:k].copy()  # a copy: a view would keep the whole batch's matrix alive
            h.present = idx
            h.installed = max(h.installed, len(idx))
        else:
            grown = _grown(h.rows, max(idx, default=-1) + 1).copy()  # no GPUs: every installed one missing
            grown[idx] = n[j:k]
            h.rows = grown
            h.present = sorted(idx)
            h.installed = max(h.installed, len(idx), max(idx, default=-1) + 1)
        h.wm, h.rack, h.job = ts_h, s.get("rack", "") or h.rack, s.get("job")
        # onsets are the first sample showing a condition, however seldom the host is scored
        gates(h, ts_h, cfg, rows_quiet=not any(hits[j:k]))
        j = k


def apply_fault(h: HostHealth, f: Mapping, cfg: HealthConfig) -> bool:
    """Record a fault event (a storm summary updates the event it summarises); False for an exact replay."""
    gpu = -1 if f.get("gpu_index") is None else int(f["gpu_index"])
    bin_ = SUSPECT if (f.get("evidence") or {}).get("mode") == "after_jobs" else f["bin"]  # the lifecycle's to time
    row = [f["fault_id"], float(f["first_ts"]), float(f["last_ts"]), gpu, f["code"], bin_, int(f["count"])]
    for i, old in enumerate(h.faults):
        if old[0] == row[0]:
            if old[2:] == row[2:]:
                return False
            h.faults[i] = row
            return True
    h.faults = sorted([*h.faults, row], key=lambda r: r[2])[-cfg.faults_kept:]
    return True


def apply_straggler(h: HostHealth, r: Mapping) -> bool:
    """Keep the newest straggler standing per GPU: only flagged ranks carry a penalty."""
    gpu = -1 if r.get("gpu_index") is None else int(r["gpu_index"])
    old = h.stragglers.get(gpu)
    if old is not None and old[0] >= r["ts"]:
        return False
    if not r["flagged"]:
        return h.stragglers.pop(gpu, None) is not None
    h.stragglers[gpu] = [float(r["ts"]), float(r["slowdown_pct"]), float(r["z"]), str(r.get("job", ""))]
    return True


def apply_remediation(h: HostHealth, r: Mapping) -> bool:
    """A successful repair or replacement ends the gates of the faults before it; a replaced card resets the count."""
    if not r["ok"] or r["action"] not in ("repair", "replace") or r["ts"] <= h.repaired_at:
        return False
    h.repaired_at = float(r["ts"])
    h.stragglers.clear()
    h.since.clear()  # gates that still fire after the repair start a new episode
    if r["action"] == "replace":
        h.installed = len(h.present)
    return True


def _history(h: HostHealth, gpu: int, now: float, cfg: HealthConfig) -> float:
    """Decayed points of this GPU's (or, for -1, the node's own) recent faults; retry/ignore capped apart."""
    hard = soft = 0.0
    for _, _, last, g, _, bin_, _ in h.faults:
        if g == gpu and now - last <= cfg.history_window_s:
            pts = cfg.bin_points.get(bin_, 0.0) * 0.5 ** (max(0.0, now - last) / cfg.history_half_life_s)
            if bin_ in GATING_BINS or bin_ == SUSPECT:
                hard += pts
            else:
                soft += pts
    return hard + min(soft, cfg.software_cap)


def _straggler(h: HostHealth, gpu: int, now: float, cfg: HealthConfig) -> float:
    rec = h.stragglers.get(gpu)
    return rec[1] if rec is not None and now - rec[0] <= cfg.straggler_ttl_s else 0.0


_DBE_AT, _ACTION = C["dbe_at"], C["action"]
_FLAGS = tuple((C[col], name) for col, name in (("pending", "row_remap_pending"), ("failure", "row_remap_failure"),
                                                ("pages", "retired_pages_pending")))


def row_gates(rows: np.ndarray, repaired_at: np.ndarray, now: np.ndarray, cfg: HealthConfig) -> list[bool]:
    """Per GPU state row (with its host's last repair and the time it is judged at): whether gates() would find a gate
    in the row itself. gates()' per-GPU tests, vectorised over many hosts; NaN tests false in both."""
    dbe_at = rows[:, _DBE_AT]
    with np.errstate(invalid="ignore"):
        hit = ((dbe_at > repaired_at) & (now - dbe_at <= cfg.fault_gate_max_s)) | (rows[:, _ACTION] > 0)
        for col, _ in _FLAGS:
            hit |= rows[:, col] == 1
    return hit.tolist()


def gates(h: HostHealth, now: float, cfg: HealthConfig, rows_quiet: bool = False) -> dict[str, float]:
    """Hard gates that fire now ('gpu3/ecc_dbe', 'fault_bin:reboot'), each with its onset; updates h.since.
    `rows_quiet`: row_gates() found nothing in the present GPUs' rows, so only lost GPUs and faults are looked at."""
    if rows_quiet and not h.faults and len(h.present) == h.installed:  # most hosts: every GPU there, nothing fired
        h.since = {}
        return {}
    out: dict[str, float] = {}
    present = set(h.present)
    rows = h.rows.tolist() if not rows_quiet else []
    for i in range(h.installed):
        if i not in present:
            out[f"gpu{i}/gpu_lost"] = now
            continue
        if rows_quiet:
            continue
        pre, row = f"gpu{i}/", rows[i] if i < len(rows) else _NAN_ROW
        dbe_at = row[_DBE_AT]
        if dbe_at > h.repaired_at and now - dbe_at <= cfg.fault_gate_max_s:
            out[pre + "ecc_dbe"] = dbe_at
        for col, name in _FLAGS:
            if row[col] == 1:
                out[pre + name] = now
        if row[_ACTION] > 0:
            out[pre + f"recovery_action:{RECOVERY.get(int(row[_ACTION]), int(row[_ACTION]))}"] = now
    for _, first, last, g, _, bin_, _ in h.faults:
        if bin_ in GATING_BINS and last > h.repaired_at and now - last <= cfg.fault_gate_max_s:
            key = (f"gpu{g}/" if g >= 0 else "") + f"fault_bin:{bin_}"
            onset = first if first > h.repaired_at else last
            out[key] = min(out.get(key, onset), onset)
    h.since = {k: min(h.since.get(k, onset), onset) for k, onset in out.items()}
    return dict(h.since)


def _reason(name: str, v: float, row: list[float]) -> str:
    if name == "thermal_headroom":
        return (f"GPU at {row[C['temp']]:g} C, {v:g} C below its {row[C['slow']]:g} C slowdown limit; HBM at "
                f"{row[C['hbm']]:g} C of {row[C['hbm_max']]:g} C")
    return {"throttle_share": f"clocks held down {100 * v:.0f}% of recent time (HW/SW thermal, power brake, cap)",
            "ecc_sbe_rate": f"{v:.0f} corrected ECC errors per hour", "pcie_replay_rate": f"{v:.1f} PCIe replays/min",
            "nvlink_error_rate": f"{v:.1f} NVLink CRC/replay errors per second (recoveries x100)",
            "straggler_slowdown": f"flagged straggler, {v:.1f}% slower than its job's median rank",
            "fault_history": f"{v:.1f} points of recent faults (decayed)"}[name]


@dataclass
class Scores:
    """One host's scores as numbers; the HealthScore rows are built only for what gets published."""

    host: str
    ts: float
    rack: str
    state: np.ndarray  # per-GPU state vectors
    values: np.ndarray  # per GPU, the measured value behind each penalty (NAMES order)
    points: np.ndarray  # per GPU, the points each penalty takes
    gpu_score: np.ndarray
    gpu_gates: list[list[str]]
    node_score: float
    node_points: list[tuple[str, float, float]]  # node-level (name, value, points)
    gates: dict[str, float]  # every gate of the node with its onset
    inputs: dict[str, float]
    job: str | None = None

    def penalties(self, i: int, prefix: str = "") -> list[Penalty]:
        row = self.state[i].tolist()
        return [Penalty(name=prefix + n, value=round(v if v == v else 0.0, 3), points=round(p, 2),
                        reason=_reason(n, v, row))
                for n, v, p in zip(NAMES, self.values[i].tolist(), self.points[i].tolist()) if p > 0]

    def gpu(self, i: int) -> HealthScore:
        return HealthScore(ts=self.ts, host=self.host, rack=self.rack, gpu_index=i, score=float(self.gpu_score[i]),
                           schedulable=not self.gpu_gates[i], gates=self.gpu_gates[i], penalties=self.penalties(i),
                           inputs={n: round(v, 3) for n, v in zip(NAMES, self.values[i].tolist()) if math.isfinite(v)})

    def node(self) -> HealthScore:
        worst = int(self.inputs["worst_gpu"])
        penalties = (self.penalties(worst, f"gpu{worst}.") if worst >= 0 else []) + [
            Penalty(name=n, value=round(val, 3), points=round(pts, 2), reason=_reason(n, val, _nan_row()))
            for n, val, pts in self.node_points]
        return HealthScore(ts=self.ts, host=self.host, rack=self.rack, score=self.node_score,
                           schedulable=not self.gates, gates=sorted(self.gates), penalties=penalties,
                           inputs=self.inputs, job=self.job)


def _moved(hosts: Sequence[tuple[HostHealth, str, float]], gpu_score: np.ndarray, cfg: HealthConfig) -> list[bool]:
    """Per GPU of `hosts` (score_all's order): whether its score is emit_delta or more from the one last published,
    or none was."""
    sent = [h.sent(h.installed)[0][:h.installed] for h, _, _ in hosts]
    prev = np.concatenate(sent) if sent else np.empty(0)
    with np.errstate(invalid="ignore"):
        return (~(np.abs(gpu_score - prev) < cfg.emit_delta)).tolist()  # NaN (never published): moved


def _z(x):
    return np.where(np.isnan(x), 0.0, x)


def score(h: HostHealth, host: str, now: float, cfg: HealthConfig) -> Scores:
    """Score every installed GPU and the node; the node takes its worst GPU, less node-level penalties."""
    return score_all([(h, host, now)], cfg)[0]


def score_all(hosts: Sequence[tuple[HostHealth, str, float]], cfg: HealthConfig,
              *, skip_quiet: bool = False) -> list[Scores | None]:
    """score() of many hosts, vectorised over all their GPUs at once. `skip_quiet`: None instead of the Scores of a
    host whose rows are not news (see streams.health.stage.news: no score moved emit_delta since it was last
    published, no gate then or now, no heartbeat due); gates and their onsets are updated all the same."""
    bounds, blocks = [0], []
    for h, _, _ in hosts:
        blocks.append(_rows(h, _IDENTITY[h.installed]))  # installed <= MAX_GPUS: indices are checked below it
        bounds.append(bounds[-1] + h.installed)
    s = np.concatenate(blocks) if blocks else np.empty((0, len(COLS)))
    per_gpu = [h.installed for h, _, _ in hosts]
    hits = row_gates(s, np.repeat([h.repaired_at for h, _, _ in hosts], per_gpu),
                     np.repeat([now for _, _, now in hosts], per_gpu), cfg)
    strag, hist, present, fired_of, gpu_gates = [], [], [], [], []
    for k, (h, _, now) in enumerate(hosts):
        n = h.installed
        if h.stragglers or h.faults:
            strag += [_straggler(h, i, now, cfg) if h.stragglers else 0.0 for i in range(n)]
            hist += [_history(h, i, now, cfg) if h.faults else 0.0 for i in range(n)]
        else:  # most hosts: neither a straggler flag nor a fault to weigh
            strag += [0.0] * n
            hist += [0.0] * n
        if h.present == _IDENTITY[n]:
            present += [True] * n
        else:
            on = set(h.present)
            present += [i in on for i in range(n)]
        fired = gates(h, now, cfg, rows_quiet=not any(hits[bounds[k]:bounds[k + 1]]))
        fired_of.append(fired)
        if fired:
            gpu_gates += [sorted(key.split("/", 1)[1] for key in fired if key.startswith(f"gpu{i}/"))
                          for i in range(h.installed)]
        else:
            gpu_gates += [_NO_GATES] * h.installed
    col = lambda c: s[:, C[c]]  # noqa: E731
    v = np.column_stack([col("slow") - col("temp"), col("hard") + cfg.power_cap_factor * col("cap"),
                         col("sbe_r") * 3600.0, col("pcie_r") * 60.0, col("nvl_r"), strag, hist])
    full = np.array([cfg.full_at[n] for n in NAMES])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = v / full
        share[:, 0] = np.fmax((full[0] - v[:, 0]) / full[0], (cfg.hbm_margin_c - (col("hbm_max") - col("hbm")))
                              / cfg.hbm_margin_c)  # headroom: less is worse
        share[:, 2] = np.log1p(v[:, 2]) / np.log1p(full[2])
    w = np.array([cfg.weights[n] for n in NAMES])
    on = np.array(present, dtype=bool)
    pts = np.where(on[:, None], w * np.clip(_z(share), 0.0, 1.0), 0.0)
    soft = np.clip(100.0 - pts.sum(axis=1), 0.0, 100.0)
    gated = np.array([bool(g) for g in gpu_gates], dtype=bool)
    gpu_score = np.round(np.where(gated, np.minimum(soft, cfg.gate_cap), soft), 2)
    strag_loss = np.where(on & ~gated, v[:, 5] / (100.0 + v[:, 5]), 0.0)
    thr = _z(col("hard")) * cfg.throttle_clock_loss + _z(col("cap")) * cfg.power_cap_clock_loss
    thr_loss = np.where(on & ~gated, np.maximum(thr - strag_loss, 0.0), 0.0)
    scores_l, gated_l = gpu_score.tolist(), gated.tolist()
    moved_l = _moved(hosts, gpu_score, cfg) if skip_quiet else []
    out: list[Scores | None] = []
    for k, (h, host, now) in enumerate(hosts):
        a, b = bounds[k], bounds[k + 1]
        fired = fired_of[k]
        node_pts = [(n, val, cfg.weights[n] * min(1.0, val / cfg.full_at[n])) for n, val in (
            ("straggler_slowdown", _straggler(h, -1, now, cfg)), ("fault_history", _history(h, -1, now, cfg)))
            if val > 0] if h.stragglers or h.faults else []
        mine = scores_l[a:b]
        low = min(mine) if mine else 100.0
        node = max(0.0, low - sum(p for _, _, p in node_pts))
        if fired:
            node = min(node, cfg.gate_cap)
        if skip_quiet and not fired and not any(moved_l[a:b]):
            last = h.emitted.get("node")
            if (last is not None and not last[1] and now - last[2] < cfg.heartbeat_s and h.job == h.told_job
                    and abs(round(node, 2) - last[0]) < cfg.emit_delta and not h.sent(b - a)[1]):
                out.append(None)
                continue
        worst = mine.index(low) if mine else -1  # the first lowest, as argmin
        inputs = {"installed_gpus": h.installed, "present_gpus": len(h.present), "gated_gpus": sum(gated_l[a:b]),
                  "straggler_loss_gpus": round(float(strag_loss[a:b].sum()), 4),
                  "throttle_loss_gpus": round(float(thr_loss[a:b].sum()), 4),
                  "worst_gpu": worst, **{f"gate_since.{key}": t for key, t in fired.items()}}
        out.append(Scores(host, now, h.rack, s[a:b], v[a:b], pts[a:b], gpu_score[a:b], gpu_gates[a:b], round(node, 2),
                          node_pts, fired, inputs, h.job))
    return out
