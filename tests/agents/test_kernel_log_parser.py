"""KernelLogParser: fall-off text without an Xid, PCI -> UUID/index, repeat dedup, and simulator lines read back."""

from __future__ import annotations

import time
from datetime import datetime

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from agents.kernel_log import KernelLogParser
from agents.simulator import FleetSimulator
from agents.simulator import xid as sim_xid
from core.errors import ConfigError

NOW = 1_780_000_000.0  # 2026-05-28, so syslog stamps without a year resolve deterministically


class Clock:
    def __init__(self, t: float = NOW):
        self.t = t

    def __call__(self) -> float:
        return self.t


def context_lines(reference_dir) -> list[str]:
    text = (reference_dir / "xid_context_lines.tsv").read_text()
    return [line.split("\t")[0] for line in text.splitlines() if line and not line.startswith("#")]


def make(**kwargs) -> KernelLogParser:
    return KernelLogParser(host="gpu-node-0001", rack="r1", cluster="c1", clock=Clock(), **kwargs)


def test_fall_off_texts_become_79_equivalents_and_uuid_lines_teach_the_gpu(reference_dir):
    parser = make(gpu_index_by_pci={"00000000:B3:00.0": 5})
    found = parser.feed_lines(context_lines(reference_dir))
    events = [d.event for d in found]
    assert [(e.code, e.pci_bus_id) for e in events] == [
        (79, "0000:2b:00.0"), (79, "0000:06:00.0"), (79, "0000:b3:00.0"), (79, "0000:01:00.0")]
    assert all(d.parsed.fell_off_text and "fall-off text" in d.event.message for d in found)
    assert [e.gpu_uuid for e in events] == ["GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
                                            "GPU-0b6b7808-c002-f593-ac86-cd8e57757b94", None,
                                            "GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d"]
    multi = found[2]
    assert multi.event.gpu_index == 5 and multi.line_no == 12  # concluded on the third line of the message
    assert multi.event.raw_line.count("\n") == 2 and multi.event.raw_line.startswith("[ 1843.308145] NVRM: The")
    assert parser.stats["uuids_learned"] == 4
    assert parser.uuid_by_pci["0000:03:00.0"] == "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
    first = events[0]
    assert (first.host, first.rack, first.cluster, first.source) == ("gpu-node-0001", "r1", "c1", "file")
    assert first.ts == datetime(2026, 5, 18, 19, 2, 39).timestamp()


def test_multi_line_message_that_is_not_a_fall_off_is_dropped():
    parser = make()
    lines = ["NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)", "NVRM: installed in this system is not supported",
             "NVRM: by the NVIDIA 550.54 driver release.", "NVRM: Please see 'Appendix A'", "NVRM: in this release",
             "NVRM: something about falling off the bus later"]
    assert parser.feed_lines(lines) == []


def test_boot_time_turns_uptime_into_wall_time():
    parser = make(boot_time=1_700_000_000.0)
    (d,) = parser.feed("[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, Ch 0000000c")
    assert d.event.ts == pytest.approx(1_700_000_365.969681)


def test_record_time_wins_and_syslog_year_never_lands_in_the_future():
    parser = make()
    (a,) = parser.feed("Dec 31 23:59:59 kernel: NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception")
    assert a.event.ts == datetime(2025, 12, 31, 23, 59, 59).timestamp()  # last year: the clock says May 2026
    (b,) = parser.feed("Dec 31 23:59:59 kernel: NVRM: Xid (PCI:0000:02:00): 13, Graphics Exception", ts=12345.0)
    assert b.event.ts == 12345.0


def test_exact_repeats_within_the_window_are_counted_not_emitted():
    clock = Clock()
    parser = KernelLogParser(host="h", dedup_window_s=10.0, clock=clock)
    line = "NVRM: Xid (PCI:0000:18:00): 31, pid=7, name=python3, Ch 00000001, intr 00000000. MMU Fault"
    emitted = []
    for i in range(30):  # one per second for 30 s: emitted at 0, 10, 20
        clock.t = NOW + i
        emitted += parser.feed(line)
    assert [d.event.ts for d in emitted] == [NOW, NOW + 10, NOW + 20]
    assert parser.stats["repeats"] == 27 and sum(parser.repeats.values()) == 27
    other_gpu = parser.feed(line.replace("0000:18:00", "0000:2a:00"))
    other_message = parser.feed(line.replace("pid=7", "pid=8"))
    assert len(other_gpu) == len(other_message) == 1


def test_xid_79_and_its_fall_off_text_are_one_fault():
    parser = make()
    lines = ["May 18 19:02:39 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
             "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
             "May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."]
    (only,) = parser.feed_lines(lines)
    assert (only.event.code, only.parsed.fell_off_text, only.event.gpu_uuid) == (
        79, False, "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae")
    assert parser.stats["repeats"] == 1


def test_host_label_and_pci_keys_are_checked_at_start():
    with pytest.raises(ConfigError):
        KernelLogParser(host="")
    with pytest.raises(ConfigError, match="PCI bus ids"):
        KernelLogParser(host="h", gpu_index_by_pci={"gpu0": 0})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=120) | st.sampled_from([
    "NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: fallen off the bus", "NVRM: GPU at PCI:0000:2b:00: GPU-x",
    "NVRM: Xid (PCI:0000:2b:00 GPU-I:999999999): 79, pid=99999999999999999999, x",
    "Feb 29 01:02:03 kernel: NVRM: Xid (PCI:0000:2b:00): 79, y"]), max_size=12))
def test_feed_never_raises(lines):
    parser = make()
    for d in parser.feed_lines(lines):
        assert d.event.code >= 0 and d.event.ts > 0


def test_every_simulator_written_line_parses_back():
    rng = np.random.default_rng(7)
    parser = KernelLogParser(host="other", dedup_window_s=0.0)
    codes = sorted(set(sim_xid.MESSAGES) | {8, 11, 39, 154})
    checked = 0
    for code in codes:
        for caused_by in (None, 79):
            message = (sim_xid.recovery_message(0, 1) if code == 154 else sim_xid.message_for(code, rng))
            ev = sim_xid.xid_event(ts=1_750_000_000.0 + checked, host="gpu-node-0003", rack="r", cluster="c",
                                   gpu_index=2, gpu_uuid="GPU-x", pci_bus_id="0000:2a:00.0", code=code,
                                   message=message, caused_by=caused_by)
            (d,) = parser.feed(ev["raw_line"])
            got = d.event.model_dump()
            for key in ("kind", "code", "pci_bus_id", "pid", "process", "caused_by", "message", "gpu_instance"):
                assert got[key] == ev[key], (key, ev["raw_line"])
            assert d.parsed.log_host == "gpu-node-0003"
            assert d.parsed.syslog_stamp == time.strftime("%b %d %H:%M:%S", time.gmtime(ev["ts"]))
            if code == 154:
                assert d.parsed.recovery_action == 1
            checked += 1
    assert checked == 2 * len(codes)


def test_simulated_fleet_xid_stream_parses_back():
    sim = FleetSimulator(4, seed=3, start_ts=1_700_000_000.0, scenario="fault-mix")
    records = [x for _ in range(170) for x in sim.step().xid]
    assert {r["code"] for r in records} >= {13, 48, 64, 79, 154}
    parser = KernelLogParser(host="ignored", dedup_window_s=0.0)
    for r in records:
        (d,) = parser.feed(r["raw_line"])
        assert (d.event.code, d.event.pci_bus_id, d.event.pid, d.event.process, d.event.caused_by) == (
            r["code"], r["pci_bus_id"], r["pid"], r["process"], r["caused_by"])


SXID_REPORT = [  # the Fabric Manager guide's three-line report, on one switch
    "[1000.000001] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
    "[1000.000002] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 Sub-engine "
    "instance 00",
    "[1000.000003] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000, 0x00140004, "
    "0x00000000}",
]


def test_a_whole_sxid_report_is_one_event_from_its_first_line():
    events = [d.event for d in make(boot_time=NOW - 5000).feed_lines(SXID_REPORT)]
    assert [(e.kind, e.code, e.severity, e.link) for e in events] == [("sxid", 28006, "Non-fatal", 46)]


@pytest.mark.parametrize("lost", [1, 2])
def test_an_sxid_report_whose_first_lines_were_lost_is_still_one_event(lost):
    parser = make(boot_time=NOW - 5000)
    events = [d.event for d in parser.feed_lines(SXID_REPORT[lost:])]
    assert len(events) == 1
    e = events[0]
    assert (e.kind, e.code, e.pci_bus_id) == ("sxid", 28006, "0000:c1:00.0")
    assert e.message == SXID_REPORT[lost].split("28006, ", 1)[1] and e.raw_line == SXID_REPORT[lost]
    assert e.ts == pytest.approx(NOW - 5000 + 1000.000001 + lost / 1e6)
    assert parser.stats["sxid_without_first_line"] == 1


def test_the_same_sxid_again_after_the_window_and_another_switch_are_events_of_their_own():
    parser = make(boot_time=NOW - 5000, dedup_window_s=10)
    later = [line.replace("[1000.", "[1030.") for line in SXID_REPORT[1:]]
    other = [line.replace("nvswitch3", "nvswitch4").replace("c1:00.0", "c2:00.0") for line in SXID_REPORT[1:]]
    events = [d.event for d in parser.feed_lines(SXID_REPORT + later + other)]
    assert [e.pci_bus_id for e in events] == ["0000:c1:00.0", "0000:c1:00.0", "0000:c2:00.0"]
    assert [e.ts - (NOW - 5000) for e in events] == pytest.approx([1000.000001, 1030.000002, 1000.000002])
