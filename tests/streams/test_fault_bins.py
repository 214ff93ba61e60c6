"""Fault bins from real XID/SXid lines: catalog bins, workflow codes, escalation, storm dedup, replays, restarts."""

from __future__ import annotations

import csv
from collections import Counter

import orjson
import pytest

from agents.kernel_log import KernelLogParser
from schemas.analytics import FaultEvent
from streams.fault_bins.rules import DEFAULTS, check_record, evaluate
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import HostState
from tests.streams.helpers import gpu, sample

TS0 = 1_700_000_000.0
PCI = {f"0000:{bus:02x}:00.0": i for i, bus in enumerate((0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB))}
LINE_119 = "NVRM: Xid (PCI:0000:2a:00): 119, pid=430, name=nv_queue, Timeout waiting for RPC from GSP!"
LINE_79 = "NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off the bus."
LINE_48 = ("NVRM: Xid (PCI:0000:5d:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the "
           "framebuffer at partition 4, subpartition 1")
LINE_13 = ("NVRM: Xid (PCI:0000:18:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
           "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")


def xid(line: str, ts: float, host: str = "h1", **fields) -> tuple[str, dict]:
    """A kernel-log line as the collector publishes it: parsed (parse_line inside), an XidEvent, checked."""
    parser = KernelLogParser(host=host, rack="r1", cluster="c1", gpu_index_by_pci=PCI, clock=lambda: ts,
                             dedup_window_s=0)
    [found] = parser.feed(line, ts=ts)
    return check_record({**found.event.model_dump(mode="json"), **fields}, "xid")


def host_sample(ts: float, *, host: str = "h1", seq: int = 0, absent: tuple[int, ...] = (),
                driver_version: str | None = None, **per_gpu) -> tuple:
    """A checked 8-GPU HostSample; per_gpu maps 'gpuN' to field overrides of GPU N."""
    healthy = {"energy_mj": 10_000_000 + int(ts - TS0) * 1000, "ecc_dbe_volatile": 0, "ecc_dbe_aggregate": 0,
               "ecc_sbe_volatile": 0, "pcie_replay_count": 3, "nvlink_crc_errors": 5, "nvlink_recovery_errors": 0,
               "row_remap_pending": False, "row_remap_failure": False}
    gpus = [gpu(i, 60.0, **{**healthy, "pci_bus_id": pci, **per_gpu.get(f"gpu{i}", {})})
            for pci, i in PCI.items() if i not in absent]
    return check_record({**sample(host, ts, gpus, seq=seq), "driver_version": driver_version}, "sample")


class Table:
    """The stage's table in miniature: host state lives only as JSON between batches (every batch a restart)."""

    def __init__(self, config: FaultBinConfig = DEFAULTS):
        self.config, self.data, self.faults, self.stats = config, {}, [], Counter()

    def feed(self, records, now: float | None = None) -> list[FaultEvent]:
        hosts = {r[1]["host"] for r in records} | (set(self.data) if now is not None else set())
        prior = {h: HostState.from_json(self.data.get(h)) for h in hosts}
        ev = evaluate(records, prior, self.config, now=now, owned=True)
        for host, st in ev.state.items():
            self.data[host] = orjson.loads(orjson.dumps(st.to_json()))
        self.faults += ev.faults
        self.stats.update(ev.stats)
        return ev.faults

    def flush(self) -> list[FaultEvent]:
        return self.feed([], now=float("inf"))

    def latest(self) -> dict[str, FaultEvent]:
        """The newest event per fault_id (a summary supersedes the first event)."""
        return {f.fault_id: f for f in self.faults}


def reference_rows(reference_dir) -> list[dict]:
    with open(reference_dir / "xid_lines_sample.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


# (code, bin, rule) per reference line, in file order: the catalog's first answer and the workflow codes.
REFERENCE_BINS = [
    (79, "reboot", "catalog"), (13, "retry", "catalog"), (109, "reset", "catalog"),
    (45, "reset", "workflow_45"),  # caused by previous Xid 145: follows 145 (NVLink5, no severity -> reset)
    (45, "ignore", "workflow_45"),  # names no cause
    (32, "retry", "catalog"), (31, "retry", "catalog"), (13, "retry", "catalog"), (31, "retry", "catalog"),
    (31, "retry", "catalog"), (31, "retry", "catalog"),
    (154, "reset", "workflow_154"),  # recovery action 0x1 GPU Reset Required
    (62, "reset", "catalog"), (62, "reset", "catalog"), (63, "ignore", "catalog"), (94, "retry", "catalog"),
    (74, "reset", "workflow_nvlink"), (48, "reset", "workflow_48"), (74, "reset", "workflow_nvlink"),
    (119, "reset", "catalog"),
]


def test_every_reference_line_gets_its_catalog_bin_with_rule_reasons_and_evidence(reference_dir):
    rows = reference_rows(reference_dir)
    assert len(rows) == len(REFERENCE_BINS)
    records = [xid(r["line"], TS0 + i, host=f"h{i}") for i, r in enumerate(rows)]
    faults = sorted(evaluate(records, {}).faults, key=lambda f: int(f.host[1:]))
    assert [(int(f.code.split(":")[1]), f.bin, f.rule) for f in faults] == REFERENCE_BINS
    for f, row in zip(faults, rows):
        assert f.catalog_action == row["catalog_action"] and f.count == 1 and f.first_ts == f.last_ts == f.ts
        assert f.evidence["code"] == row["code"] and f.evidence["pci"].startswith(row["pci"])
        assert f.evidence["message"] in row["line"] and f.evidence["emission"] == "first"
        assert f.reasons and f.reasons[0].endswith(f"-> {f.bin}")
    assert faults[3].evidence["caused_by"] == "145" and "follows Xid 145" in faults[3].reasons[0]
    assert faults[16].evidence["link"] == "14" and faults[16].evidence["severity"] == "fatal"


@pytest.mark.parametrize("line, fields, expected", [
    # NVLink5: the unit and severity the line carries (REFERENCE.md §1a)
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 ...)", {},
     ("xid:149", "reset", "workflow_nvlink5", "WORKFLOW_NVLINK5_ERR", {"unit": "NETIR", "severity": "Fatal"})),
    (("NVRM: Xid (PCI:0000:9a:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 "
      "0x00000000 0x00100000 0x00000004)"), {},
     ("xid:145", "ignore", "workflow_nvlink5", "WORKFLOW_NVLINK5_ERR", {"unit": "RLW_RXPIPE", "link": "13"})),
    # Xid 154 takes the recovery action written in the line
    ("NVRM: Xid (PCI:0004:01:00.0): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     {}, ("xid:154", "reboot", "workflow_154", "XID_154", {"recovery_action": "2"})),
    ("NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
     {}, ("xid:154", "ignore", "workflow_154", "XID_154", {"recovery_action": "0"})),
    # ... also when a producer left the parsed field empty (the simulator does)
    ("NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     {"recovery_action": None}, ("xid:154", "reset", "workflow_154", "XID_154", {"recovery_action": "1"})),
    # Xid 45 follows the Xid it names, from the field or from the line
    ("NVRM: Xid (PCI:0000:ba:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149", {},
     ("xid:45", "reset", "workflow_45", "WORKFLOW_XID_45", {"caused_by": "149"})),
    ("NVRM: Xid (PCI:0000:ba:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 79",
     {"caused_by": None}, ("xid:45", "reboot", "workflow_45", "WORKFLOW_XID_45", {"caused_by": "79"})),
    # Xid 74 whose collector decoded a non-fatal error
    ("NVRM: Xid (PCI:0000:c1:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 1",
     {"severity": "Nonfatal"}, ("xid:74", "ignore", "workflow_nvlink", "WORKFLOW_NVLINK_ERR", {"link": "1"})),
    # unknown codes go to a person
    ("NVRM: Xid (PCI:0000:18:00): 999, pid=1, name=x, something new", {},
     ("xid:999", "inspect", "unknown_code", "UNKNOWN", {"code": "999"})),
    # SXids (gpud's and the Fabric Manager guide's lines)
    (("[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
      "PRIV error (First)"), {}, ("sxid:12028", "reset", "sxid", "RESET_FABRIC", {"severity": "Non-fatal"})),
    ("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up", {},
     ("sxid:20034", "reset", "sxid", "SXID_FATAL", {"pci": "0000:a9:00.0"})),
])
def test_workflow_codes_take_what_the_line_says(line, fields, expected):
    [f] = evaluate([xid(line, TS0, **fields)], {}).faults
    code, bin_, rule, action, evidence = expected
    assert (f.code, f.bin, f.rule, f.catalog_action) == (code, bin_, rule, action)
    assert {k: f.evidence[k] for k in evidence} == evidence
    if code.startswith("sxid"):  # the NVSwitch's PCI id, not a GPU's
        assert f.gpu_index is None and f.evidence["pci"] != "None"


def test_xid_gpu_is_resolved_by_index_or_by_the_pci_id_a_sample_taught():
    t = Table()
    t.feed([host_sample(TS0)])
    no_index = xid(LINE_119, TS0 + 1, gpu_index=None)
    [f] = t.feed([no_index])
    assert (f.gpu_index, f.gpu_uuid) == (1, "GPU-0001")  # 0000:2a:00.0 is GPU 1 in the sample


def test_the_same_fatal_xid_n_times_in_a_window_escalates_to_replace():
    t = Table()
    burst = [xid(LINE_119, TS0 + s) for s in (0, 5, 10, 30)]  # one incident: lines within incident_gap_s
    t.feed(burst)
    t.feed([xid(LINE_119, TS0 + 600), xid(LINE_119, TS0 + 1200)])
    firsts = [(f.bin, f.rule, f.ts - TS0) for f in t.faults if f.evidence["emission"] == "first"]
    assert firsts == [("reset", "catalog", 0), ("reset", "catalog", 600), ("replace", "escalation_repeat", 1200)]
    replace = t.faults[-1]
    assert replace.evidence["repeats"] == "3" and replace.evidence["repeat_limit"] == "3"
    assert "3 times within 24 h (limit 3" in replace.reasons[-1] and replace.gpu_index == 1
    # another GPU's history is its own; a day later the old incidents no longer count
    [other] = t.feed([xid(LINE_119.replace("2a:00", "3a:00"), TS0 + 1300)])
    [later] = t.feed([xid(LINE_119, TS0 + 1200 + 86_400 + 1)])
    assert (other.gpu_index, other.bin, later.bin) == (2, "reset", "reset")


def test_xid_48_escalates_on_its_first_repeat():
    t = Table()
    t.feed([xid(LINE_48, TS0)])
    [again] = t.feed([xid(LINE_48, TS0 + 3600)])
    assert (t.faults[0].bin, again.bin, again.rule, again.evidence["repeats"]) == (
        "reset", "replace", "escalation_repeat", "2")


def test_returning_after_k_reboots_escalates_to_replace():
    """Xid 79, the GPU drops out of the samples, comes back (a reboot) -- twice; the third Xid 79 is replace."""
    t, ts, seq = Table(), TS0, 0
    t.feed([host_sample(TS0 - 10)])  # the GPU was there before
    bins = []
    for cycle in range(3):
        [fault] = t.feed([xid(LINE_79, ts)])
        bins.append((fault.bin, fault.rule))
        if cycle == 2:
            break
        for k in (1, 2, 3):  # missing from three samples: lost once, not three times
            seq += 1
            t.feed([host_sample(ts + k, seq=seq, absent=(2,))])
        seq += 1
        t.feed([host_sample(ts + 60, seq=seq)])  # back: a reboot that followed a fatal fault
        ts += 25 * 3600  # a day apart: the repeat rule (3 in 24 h) never sees more than two
    assert bins == [("reboot", "catalog"), ("reboot", "catalog"), ("replace", "escalation_reboots")]
    assert t.faults[-1].evidence["reboots"].count("returned at") == 2
    lost = [f for f in t.faults if f.code == "gpu_lost"]
    assert [(f.gpu_index, f.bin, f.count) for f in lost] == [(2, "reboot", 1), (2, "reboot", 1)]


def test_reboots_seen_in_counters_escalate_even_when_repeats_alone_would_not():
    config = FaultBinConfig(repeat_n=10)
    t, seq = Table(config), 0
    t.feed([host_sample(TS0)])
    bins = []
    for cycle in range(3):
        base = TS0 + cycle * 7200
        bins += [f.bin for f in t.feed([xid(LINE_119, base + 10)])]
        for dt in (20, 60, 100):  # energy since driver load restarts at the reboot (base + 20), then grows
            seq += 1
            t.feed([host_sample(base + dt, seq=seq, gpu1={"energy_mj": 5_000 + (dt - 20) * 700_000})])
    assert bins == ["reset", "reset", "replace"]
    esc = t.faults[-1]
    assert esc.rule == "escalation_reboots" and esc.evidence["reboots"].count("energy_mj went back") == 2
    # A reboot with no fatal fault before it does not count toward the next one.
    quiet = Table(config)
    quiet.feed([host_sample(TS0)])
    quiet.feed([host_sample(TS0 + 20, seq=1, gpu1={"energy_mj": 5_000})])
    quiet.feed([host_sample(TS0 + 60, seq=2, driver_version="550.90.07")])
    quiet.feed([host_sample(TS0 + 100, seq=3, driver_version="560.35.03")])  # a driver change is a reboot too
    assert [f.bin for f in quiet.feed([xid(LINE_119, TS0 + 200)])] == ["reset"]
    quiet.feed([host_sample(TS0 + 300, seq=4, driver_version="570.86.10")])  # after the fault: this one counts
    reboots = {g: [how for _, how in m["b"]] for g, m in quiet.data["h1"]["gpus"].items() if m["b"]}
    assert reboots == {"1": ["driver version changed from 560.35.03 to 570.86.10"]}


def test_a_storm_of_1000_identical_lines_is_one_event_then_one_summary_with_count_1000():
    t = Table()
    lines = [xid(LINE_13, TS0 + 0.1 * i) for i in range(1000)]
    emitted = []
    for k in range(0, 1000, 100):  # ten batches, as the stage would take them
        emitted += t.feed(lines[k:k + 100])
    [first] = emitted
    assert (first.count, first.ts, first.bin, first.evidence["emission"]) == (1, TS0, "retry", "first")
    [summary] = t.feed([host_sample(TS0 + 300)])  # the host's next record past the window closes it
    assert (summary.fault_id, summary.count, summary.first_ts, summary.ts) == (first.fault_id, 1000, TS0, TS0 + 300)
    assert summary.last_ts == pytest.approx(TS0 + 99.9) and summary.evidence["emission"] == "summary"
    assert "1000 occurrences" in summary.reasons[-1]
    [after] = t.feed([xid(LINE_13, TS0 + 301)])  # a new window: a new fault_id, out at once
    assert after.fault_id != first.fault_id and after.count == 1
    assert t.flush() == [] and sum(f.count for f in t.latest().values()) == 1001


def test_collector_folded_repeats_count_and_a_window_with_nothing_folded_sends_no_summary():
    t = Table()
    [f] = t.feed([xid(LINE_13, TS0, count=5)])
    assert f.count == 5 and t.flush() == []


def test_replayed_records_are_not_counted_twice():
    xids = [xid(LINE_13, TS0 + i) for i in range(10)]
    records = xids[:5] + [xid(LINE_48, TS0 + 5)] + xids[5:] + [host_sample(TS0 + i + 0.5, seq=i) for i in range(10)]
    once = Table()
    once.feed(records)
    once.flush()
    replayed = Table()
    replayed.feed(records[:15])
    replayed.feed(records[:15])  # the worker died before committing: everything comes again
    replayed.feed(records[9:])  # and a partial overlap: two XIDs and four samples again
    assert replayed.stats["replayed"] == 15 + 6
    replayed.flush()
    assert {k: (f.count, f.bin) for k, f in replayed.latest().items()} == \
        {k: (f.count, f.bin) for k, f in once.latest().items()}
    assert sum(f.count for f in once.latest().values() if f.code == "xid:13") == 10


def test_an_xid_late_within_the_slack_counts_and_one_older_than_that_is_taken_for_a_replay():
    t = Table()
    t.feed([xid(LINE_13, TS0 + 10)])
    [late] = t.feed([xid(LINE_48, TS0 + 10 - 1.5)])  # another source's clock, 1.5 s behind: still applied
    assert late.code == "xid:48" and t.feed([xid(LINE_119, TS0 + 10 - 2.5)]) == []
    assert t.stats["replayed"] == 1


def test_one_batch_or_one_record_per_batch_through_json_gives_the_same_faults():
    records = [xid(LINE_119, TS0 + 100 * i) for i in range(4)]
    records += [host_sample(TS0 + 7 * i, seq=i, absent=(4,) if 20 <= i < 25 else (),
                            gpu6={"pcie_replay_count": 3 + 2 * i}) for i in range(60)]
    whole, single = Table(), Table()
    whole.feed(records)
    for r in records:
        single.feed([r])
    whole.flush()
    single.flush()

    def key(t):
        return sorted((f.fault_id, f.code, f.bin, f.count, f.first_ts) for f in t.latest().values())

    assert key(whole) == key(single) and {f.code for f in whole.faults} == {"xid:119", "gpu_lost", "pcie_replay"}
