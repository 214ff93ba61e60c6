"""Per-host fault-bin state (GPU memory, storm-dedup windows) as small JSON, and the FaultEvents its windows emit."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

from schemas.pci import normalize_pci
from schemas.analytics import FaultEvent
from streams.fault_bins.config import FaultBinConfig

VERSION = 1


@dataclass
class Finding:
    """One occurrence of a fault on one GPU (key '3', 'pci:...', 'nvswitch:...' or 'host') as a rule saw it."""

    gpu: str
    code: str
    bin: str
    rule: str
    action: str | None
    count: int
    reasons: list[str]
    evidence: dict[str, str]
    gpu_index: int | None = None
    gpu_uuid: str | None = None


@dataclass
class Window:
    """An open dedup window of one (GPU, code, bin): its occurrences since first_ts, and how many went out."""

    fault_id: str
    finding: Finding
    first_ts: float
    last_ts: float
    count: int
    emitted: int

    def to_json(self) -> list:
        f = self.finding
        return [self.fault_id, f.gpu, f.code, f.bin, f.rule, f.action, f.gpu_index, f.gpu_uuid, f.reasons,
                f.evidence, self.first_ts, self.last_ts, self.count, self.emitted]

    @classmethod
    def from_json(cls, raw: list) -> Window:
        fid, gpu, code, bin_, rule, action, index, uuid, reasons, evidence, first, last, count, emitted = raw
        return cls(fid, Finding(gpu, code, bin_, rule, action, count, reasons, evidence, index, uuid),
                   first, last, count, emitted)


@dataclass
class GpuMemo:
    """What the rules remember of one GPU: its last reading, rate-window starts, lost state and fault history."""

    uuid: str | None = None
    pci: str | None = None
    ts: float = 0.0  # time of the last reading (0: never in a sample, e.g. known only from an Xid)
    last: list = field(default_factory=list)  # fault_counters.FIELDS values at ts
    miss: int = 0  # consecutive host samples without this GPU
    missing_since: float | None = None
    lost: bool = False
    refs: dict[str, list[float]] = field(default_factory=dict)  # rate rule code -> [window start ts, count then]
    hist: dict[str, list[float]] = field(default_factory=dict)  # fault code -> incident times in the repeat window
    reboots: list[list] = field(default_factory=list)  # [ts, how it was seen] of reboots that followed a fatal fault
    fatal: bool = False  # a reset/reboot-bin fault since the last reboot
    ep: dict[str, list] = field(default_factory=dict)  # link episode (gpu_links.py) -> [since ts, samples, told]
    links: int = 0  # the most NVLink links seen active at once since the GPU was (re)started
    fabric_ok: bool = False  # its fabric was seen trained (success) since it was (re)started
    tr: list = field(default_factory=list)  # corrected-error trend (trends.py): [ts, count, fast, slow, since]

    def rebooted(self, ts: float, how: str, config: FaultBinConfig) -> None:
        """A reboot (or reset) of this GPU was seen; it counts toward escalation only if a fatal fault preceded it.
        Links train again after it: what they ran at before and the episodes told are forgotten."""
        self.ep, self.links, self.fabric_ok = {}, 0, False
        if self.fatal:
            self.reboots = [r for r in self.reboots if ts - r[0] < config.reboots_window_s][-2 * config.reboots_k:]
            self.reboots.append([ts, how])
            self.fatal = False

    def to_json(self) -> dict:
        return {"u": self.uuid, "p": self.pci, "t": self.ts, "l": self.last, "m": self.miss, "ms": self.missing_since,
                "lo": self.lost, "r": self.refs, "h": self.hist, "b": self.reboots, "f": self.fatal, "e": self.ep,
                "nl": self.links, "fo": self.fabric_ok, "tr": self.tr}

    @classmethod
    def from_json(cls, raw: dict) -> GpuMemo:
        return cls(raw["u"], raw["p"], raw["t"], list(raw["l"]), raw["m"], raw["ms"], raw["lo"],
                   {k: list(v) for k, v in raw["r"].items()}, {k: list(v) for k, v in raw["h"].items()},
                   [list(r) for r in raw["b"]], raw["f"], {k: list(v) for k, v in raw.get("e", {}).items()},
                   raw.get("nl", 0), raw.get("fo", False), list(raw.get("tr", [])))  # .get: older states


@dataclass
class PortMemo:
    """What the rules remember of one port (key 'mlx5_0/1'): its last reading and the episodes it is in."""

    ts: float = 0.0
    active: bool = False  # seen ACTIVE since the host (re)started: only then is a port that is not a fault
    best_gbps: float = 0.0  # the highest rate seen while ACTIVE: what the cable and the switch port can do
    down: int = 0  # consecutive samples not ACTIVE (while `active`)
    down_since: float | None = None  # the first of them
    slow: int = 0  # consecutive ACTIVE samples below best_gbps
    slow_since: float | None = None  # the first of them
    told: list[str] = field(default_factory=list)  # episodes already reported: "down", "slow"
    downed: int | None = None  # link_downed at ts
    flaps: list[float] = field(default_factory=list)  # times link_downed grew, within flap_window_s
    errs: list[list] = field(default_factory=list)  # [ts, [each PHY_ERRORS counter]] readings within phy_window_s

    def restart(self) -> None:
        """The host (or its driver) restarted: counters start again and the port must be seen ACTIVE again; what it
        ran at and the drops it had stay known."""
        self.active, self.down, self.down_since, self.slow, self.slow_since = False, 0, None, 0, None
        self.told, self.downed, self.errs = [], None, []

    def decisive(self) -> tuple:
        """What the rules decide from, not when it was last read: a change here is written at once, a reading that
        only refreshes times waits for the host's periodic flush (state_flush_s), as GPU readings do."""
        return (self.active, self.best_gbps, self.down, self.down_since, self.slow, self.slow_since, tuple(self.told),
                self.downed, tuple(self.flaps), tuple(tuple(v) for _, v in self.errs))

    def to_json(self) -> list:
        return [self.ts, self.active, self.best_gbps, self.down, self.down_since, self.slow, self.slow_since,
                self.told, self.downed, self.flaps, self.errs]

    @classmethod
    def from_json(cls, raw: list) -> PortMemo:
        ts, active, best, down, since, slow, slow_since, told, downed, flaps, errs = raw
        return cls(ts, active, best, down, since, slow, slow_since, list(told), downed, list(flaps),
                   [[t, list(v)] for t, v in errs])


@dataclass
class HostState:
    """One host's fault-bin state (the table value, keyed by host); `clock` is the newest event time applied."""

    rack: str = ""
    clock: float = 0.0
    swm: float = 0.0  # newest sample time applied: a sample at or before it is a replay
    xwm: float = 0.0  # newest XID time applied
    digests: dict[str, float] = field(default_factory=dict)  # XIDs applied within the replay slack of xwm
    driver: str | None = None
    gpus: dict[str, GpuMemo] = field(default_factory=dict)
    open: dict[str, Window] = field(default_factory=dict)
    written: float = 0.0  # clock when this state was last handed out to be written
    nwm: float = 0.0  # newest NetSample time applied
    nseq: int = -1  # its seq: one that goes back is a restarted agent (the host may have rebooted)
    hwm: float = 0.0  # newest HostEvent time applied (its own: the kernel's host lines and XIDs come on two topics)
    hdigests: dict[str, float] = field(default_factory=dict)  # HostEvents applied within the replay slack of hwm
    ports: dict[str, PortMemo] = field(default_factory=dict)  # "mlx5_0/1" -> the port's memory
    job: str | None = None  # the job its newest sample names: each fault says what it hits (a drain's cost)
    dirty: bool = field(default=False, compare=False)  # changed in a way a rule reads (not serialised)

    def memo(self, gpu: str) -> GpuMemo:
        memo = self.gpus.get(gpu)
        if memo is None:  # not setdefault: that builds a GpuMemo on every call
            memo = self.gpus[gpu] = GpuMemo()
        return memo

    def to_json(self) -> dict:
        return {"v": VERSION, "rack": self.rack, "clock": self.clock, "swm": self.swm, "xwm": self.xwm,
                "dig": self.digests, "drv": self.driver, "gpus": {k: m.to_json() for k, m in self.gpus.items()},
                "open": {k: w.to_json() for k, w in self.open.items()}, "wr": self.written, "nwm": self.nwm,
                "nseq": self.nseq, "hwm": self.hwm, "hdig": self.hdigests,
                "ports": {k: p.to_json() for k, p in self.ports.items()}, "job": self.job}

    @classmethod
    def from_json(cls, raw: dict | None) -> HostState:
        if not raw or raw.get("v") != VERSION:  # none yet, or written by an older layout: start afresh
            return cls()
        return cls(raw["rack"], raw["clock"], raw["swm"], raw["xwm"], dict(raw["dig"]), raw["drv"],
                   {k: GpuMemo.from_json(m) for k, m in raw["gpus"].items()},
                   {k: Window.from_json(w) for k, w in raw["open"].items()}, raw["wr"], raw.get("nwm", 0.0),
                   raw.get("nseq", -1), raw.get("hwm", 0.0), dict(raw.get("hdig", {})),  # .get: older states
                   {k: PortMemo.from_json(p) for k, p in raw.get("ports", {}).items()}, raw.get("job"))

    def copy(self) -> HostState:
        return HostState.from_json(self.to_json())


@lru_cache(maxsize=4096)  # a fleet has few distinct PCI ids; every sample repeats them
def norm_pci(text: str | None) -> str | None:
    """One form for PCI ids from NVML, DCGM and the kernel log ('0000:2b:00.0'); text that is none kept lowercased."""
    if not text:
        return None
    try:
        return normalize_pci(text)
    except (ValueError, IndexError):
        return text.lower()


def fault_id(host: str, gpu: str, code: str, bin_: str, first_ts: float) -> str:
    """Stable across replays and restarts: host, GPU, code, bin and the window's start (event time)."""
    return hashlib.sha256(f"{host}|{gpu}|{code}|{bin_}|{first_ts:.6f}".encode()).hexdigest()[:20]


def to_event(host: str, st: HostState, w: Window, ts: float, emission: str, config: FaultBinConfig) -> FaultEvent:
    f = w.finding
    evidence = {**f.evidence, "emission": emission, "dedup_window_s": f"{config.dedup_window_s:g}",
                "dedup_window_end": f"{w.first_ts + config.dedup_window_s:.3f}", **({"job": st.job} if st.job else {})}
    reasons = list(f.reasons)
    if emission == "summary":
        reasons.append(f"{w.count} occurrences of {f.code} on {host} GPU {f.gpu} between {w.first_ts:.3f} and "
                       f"{w.last_ts:.3f}, folded into this event (one per {config.dedup_window_s:g} s window)")
    return FaultEvent(fault_id=w.fault_id, ts=ts, host=host, rack=st.rack, gpu_index=f.gpu_index, gpu_uuid=f.gpu_uuid,
                      code=f.code, bin=f.bin, catalog_action=f.action, rule=f.rule, count=w.count,
                      first_ts=w.first_ts, last_ts=w.last_ts, reasons=reasons, evidence=evidence)


def record(st: HostState, host: str, f: Finding, ts: float, config: FaultBinConfig) -> FaultEvent | None:
    """Fold one finding into its window; a finding that opens a window is emitted at once (latency matters)."""
    key = f"{f.gpu}|{f.code}|{f.bin}"
    w = st.open.get(key)
    if w is not None:
        w.count += f.count
        w.last_ts = max(w.last_ts, ts)
        return None
    w = Window(fault_id(host, f.gpu, f.code, f.bin, ts), f, ts, ts, f.count, f.count)
    st.open[key] = w
    return to_event(host, st, w, ts, "first", config)


def close_due(st: HostState, host: str, until: float, config: FaultBinConfig) -> list[FaultEvent]:
    """Close the windows that ended by `until`; one with occurrences folded since its last event emits a summary."""
    out = []
    for key, w in list(st.open.items()):
        end = w.first_ts + config.dedup_window_s
        if end <= until:
            del st.open[key]
            if w.count > w.emitted:
                w.emitted = w.count
                out.append(to_event(host, st, w, end, "summary", config))
    return out
