"""Property tests: any sequence of XIDs and samples never raises, conserves counts, and shrugs off replays."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings, strategies as st

from schemas.analytics import FaultBin
from schemas.events import XidEvent
from streams.fault_bins.rules import check_record
from streams.fault_bins.config import FaultBinConfig
from tests.streams.helpers import gpu, sample
from tests.streams.test_fault_bins import TS0, Table

HOSTS = ("h1", "h2")
PCIS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")
CONFIG = FaultBinConfig(dedup_window_s=120, incident_gap_s=30, repeat_window_s=3600, reboots_window_s=7200)

xid_step = st.fixed_dictionaries({
    "type": st.just("xid"), "host": st.sampled_from(HOSTS), "dt": st.sampled_from([0, 0.001, 0.5, 3, 40, 200]),
    "kind": st.sampled_from(["xid"] * 9 + ["sxid"]),
    "code": st.sampled_from([13, 13, 31, 45, 48, 62, 74, 79, 119, 145, 149, 154, 999, 12028, 20034]),
    "gpu": st.sampled_from([0, 1, 2, 3, None]), "pci_only": st.booleans(), "count": st.integers(1, 3),
    "severity": st.sampled_from([None, "Fatal", "Nonfatal", "Link Fatal"]),
    "caused_by": st.sampled_from([None, 13, 79, 149]), "recovery": st.sampled_from([None, 0, 1, 2, 4, 7]),
})
sample_step = st.fixed_dictionaries({
    "type": st.just("sample"), "host": st.sampled_from(HOSTS), "dt": st.sampled_from([0.5, 1, 5, 30, 200]),
    "absent": st.sets(st.integers(0, 3), max_size=2), "reboot": st.booleans(),
    "dbe": st.sampled_from([0, 0, 0, 1]), "pcie": st.sampled_from([0, 0, 3, 12]),
    "crc": st.sampled_from([0, 0, 50, 500]), "recovery": st.sampled_from([0, 0, 0, 1]),
    "pending": st.booleans(), "failure": st.sampled_from([False, False, False, True]),
    "gpu": st.integers(0, 3),
})
scripts = st.lists(st.one_of(xid_step, sample_step), min_size=1, max_size=60)


def build(script: list[dict]) -> list[tuple[str, dict]]:
    """Records in publish order: event time never goes back within a host; XID lines are all distinct."""
    ts, out, n = {h: TS0 for h in HOSTS}, [], 0
    counters = {h: {g: {"dbe": 0, "pcie": 0, "crc": 0, "rec": 0, "energy": 1_000_000} for g in range(4)} for h in HOSTS}
    for step in script:
        host = step["host"]
        ts[host] += step["dt"]
        n += 1
        if step["type"] == "xid":
            g, sxid = step["gpu"], step["kind"] == "sxid"
            event = XidEvent(host=host, rack="r1", ts=ts[host], kind=step["kind"], code=step["code"],
                             pci_bus_id=PCIS[g] if g is not None else None,
                             gpu_index=None if g is None or step["pci_only"] or sxid else g,
                             severity=step["severity"], caused_by=step["caused_by"],
                             recovery_action=step["recovery"], count=step["count"], message=f"pid={n}, line {n}",
                             source="simulator")
            out.append(check_record(event.model_dump(mode="json"), "xid"))
            continue
        ts[host] += 0.01  # samples of one host are strictly ordered
        c = counters[host][step["gpu"]]
        c["dbe"] += step["dbe"]
        c["pcie"] += step["pcie"]
        c["crc"] += step["crc"]
        c["rec"] += step["recovery"]
        for cg in counters[host].values():
            cg["energy"] = 5_000 if step["reboot"] else cg["energy"] + 700_000
        gpus = [gpu(i, 60.0, pci_bus_id=PCIS[i], ecc_dbe_aggregate=cg["dbe"], pcie_replay_count=cg["pcie"],
                    nvlink_crc_errors=cg["crc"], nvlink_recovery_errors=cg["rec"], energy_mj=cg["energy"],
                    row_remap_pending=step["pending"] and i == step["gpu"],
                    row_remap_failure=step["failure"] and i == step["gpu"])
                for i, cg in counters[host].items() if i not in step["absent"]]
        out.append(check_record(sample(host, ts[host], gpus, seq=n), "sample"))
    return out


def feed(records, cuts: list[int], replays: list[int]) -> Table:
    t = Table(CONFIG)
    bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        t.feed(records[a:b])
        if i in replays:  # the worker died before committing: the batch comes again, and some before it
            t.feed(records[max(0, a - 3):b])
    t.flush()
    return t


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts, st.lists(st.integers(0, 200), max_size=8), st.lists(st.integers(0, 8), max_size=4))
def test_any_sequence_never_raises_conserves_counts_and_ignores_replays(script, cuts, replays):
    records = build(script)
    plain = feed(records, cuts, [])
    replayed = feed(records, cuts, replays)
    latest = plain.latest()
    # Every occurrence ends up in exactly one fault event's final count; XID occurrences are the lines' counts.
    assert sum(f.count for f in latest.values()) == plain.stats["occurrences"]
    xid_lines = sum(r["count"] for kind, r in records if kind == "xid")
    assert sum(f.count for f in latest.values() if f.code.startswith(("xid:", "sxid:"))) == xid_lines
    # A fault_id names one (host, GPU, code, bin, window) for good; events of one id only grow.
    for f in plain.faults:
        first = next(e for e in plain.faults if e.fault_id == f.fault_id)
        assert (f.host, f.gpu_index, f.code, f.bin, f.first_ts) == (
            first.host, first.gpu_index, first.code, first.bin, first.first_ts)
        assert f.count >= first.count and f.last_ts >= f.first_ts and FaultBin(f.bin) and f.rule and f.reasons
    # Replays change nothing anyone downstream sees.
    assert {k: (f.count, f.bin, f.last_ts) for k, f in replayed.latest().items()} == \
        {k: (f.count, f.bin, f.last_ts) for k, f in latest.items()}
