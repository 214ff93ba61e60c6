"""parse_host_line on the real host lines of tests/data/host_kernel_lines.tsv, and HostEvents through the parser and
the collector beside XidEvents: line order, timestamps, source labels, repeat folding, and each topic's validator."""

from __future__ import annotations

import asyncio
import csv
import functools
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from agents.kernel_log import KernelLogCollector, KernelLogParser, Record, StaticSource
from agents.kernel_log.host_lines import CODES, parse_host_line
from schemas.events import HOST_SUBSYSTEMS, HostEvent, XidEvent
from schemas.limits import ID_MAX
from schemas.topics import HOST_EVENTS, XID

DATA = Path(__file__).resolve().parents[1] / "data" / "host_kernel_lines.tsv"
NOW = 1_780_000_000.0  # 2026-05-28, so syslog stamps without a year resolve deterministically
XID_LINE = "[ 1843.308145] NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
NVME_DOWN = "nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0x10"
LINK_DOWN = "mlx5_core 0000:1a:00.0 ens1f0np0: Link down"
EDAC_CE = "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0x6c01e4)"


def rows() -> list[dict]:
    if not DATA.is_file():
        pytest.fail(f"host kernel-line data missing: expected {DATA}")
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@functools.cache
def real_lines() -> tuple[str, ...]:
    return tuple(r["line"] for r in rows() if r["code"])


def make(**kwargs) -> KernelLogParser:
    return KernelLogParser(host="gpu-node-0001", rack="r1", cluster="c1", clock=lambda: NOW, **kwargs)


def test_every_real_line_parses_to_its_subsystem_code_device_and_severity():
    table = rows()
    for row in table:
        assert row["source"], row["line"]
        p = parse_host_line(row["line"])
        got = (p.subsystem, p.code, p.device or "", p.severity) if p else ("", "", "", "")
        assert got == (row["subsystem"], row["code"], row["device"], row["severity"]), row["line"]
    matching = [r for r in table if r["code"]]
    assert len(matching) >= 40 and len(table) > len(matching)
    assert {r["code"] for r in matching} == set(CODES)  # every code has a real line
    assert {CODES[r["code"]] for r in matching} == set(HOST_SUBSYSTEMS)


def test_the_message_is_the_kernel_text_and_the_prefix_gives_the_time():
    p = parse_host_line("Aug 28 18:15:30 instance-1 kernel: [28599.037759] EXT4-fs (sdb): Remounting filesystem "
                        "read-only")
    assert (p.message, p.syslog_stamp, p.log_host, p.uptime_s) == (
        "EXT4-fs (sdb): Remounting filesystem read-only", "Aug 28 18:15:30", "instance-1", 28599.037759)
    p = parse_host_line(f"2026-05-18T19:02:39.250+00:00 gpu-node-0007 kernel: {LINK_DOWN}")
    assert (p.message, p.log_host) == (LINK_DOWN, "gpu-node-0007")
    assert p.wall_ts == datetime.fromisoformat("2026-05-18T19:02:39.250+00:00").timestamp()


def test_an_xid_line_is_only_ever_an_xid_event(reference_dir):
    with open(reference_dir / "xid_lines_sample.tsv", newline="") as f:
        lines = [r["line"] for r in csv.DictReader(f, delimiter="\t")]
    assert not any(parse_host_line(line) for line in lines)
    found = make(dedup_window_s=0.0).feed_lines(lines)
    assert len(found) == len(lines) and all(isinstance(d.event, XidEvent) for d in found)


def test_a_mixed_stream_through_the_collector_keeps_line_order_time_and_source():
    source = StaticSource([Record(XID_LINE, 100.0), Record("usb 1-1: new high-speed USB device number 2", 101.0),
                           Record(f"{NVME_DOWN}\n{LINK_DOWN}", 102.0), Record(EDAC_CE, 103.0)], kind="journald")
    collector = KernelLogCollector(source, host="gpu-node-0004", rack="r2", gpu_index_by_pci={"0000:2b:00.0": 3},
                                   clock=lambda: NOW)
    events = collector.sample()
    assert [type(e) for e in events] == [XidEvent, HostEvent, HostEvent, HostEvent]
    assert [e.ts for e in events] == [100.0, 102.0, 102.0, 103.0]
    assert {(e.host, e.rack, e.source) for e in events} == {("gpu-node-0004", "r2", "journald")}
    xid, nvme, link, edac = events
    assert (xid.code, xid.gpu_index) == (79, 3)
    assert [(e.subsystem, e.code, e.device, e.severity) for e in (nvme, link, edac)] == [
        ("storage", "nvme_controller_down", "nvme0", "fatal"), ("nic", "nic_link_down", "0000:1a:00.0", "warning"),
        ("machine_check", "memory_ce", "MC0 CPU_SrcID#0_MC#0_Chan#0_DIMM#0", "corrected")]
    assert (link.message, link.raw_line, link.count) == (LINK_DOWN, LINK_DOWN, 1)
    assert XID.check(xid.model_dump())["code"] == 79
    for event in (nvme, link, edac):
        assert HOST_EVENTS.check(event.model_dump())["code"] == event.code


def test_host_lines_take_their_time_from_the_prefix_like_xid_lines():
    parser = make(boot_time=NOW - 5000, source="kmsg")
    (uptime,) = parser.feed("[  204.791017] mlx5_core 0000:41:00.0: poll_health:478:(pid 0): Fatal error 1 detected")
    (stamped,) = parser.feed("May 07 03:35:06 gcc202 kernel: blk_update_request: I/O error, dev vdiskc, sector 6572")
    (own,) = parser.feed(NVME_DOWN, ts=NOW - 1, source="journald")
    assert uptime.event.ts == pytest.approx(NOW - 5000 + 204.791017) and uptime.event.source == "kmsg"
    assert stamped.event.ts == datetime(2026, 5, 7, 3, 35, 6).timestamp()
    assert (own.event.ts, own.event.source) == (NOW - 1, "journald")


def test_exact_repeats_fold_into_the_repeat_count_like_xids():
    clock = [NOW]
    parser = KernelLogParser(host="h", dedup_window_s=10.0, clock=lambda: clock[0])
    emitted = []
    for _ in range(5):
        emitted += parser.feed(NVME_DOWN) + parser.feed(XID_LINE)
        clock[0] += 1
    assert [type(d.event) for d in emitted] == [HostEvent, XidEvent]
    assert sorted(parser.repeats.values()) == [4, 4] and parser.stats["repeats"] == 8
    assert parser.stats["host_events"] == 1 and parser.stats["events"] == 1
    assert len(parser.feed(NVME_DOWN.replace("nvme0", "nvme1"))) == 1  # another device is another fault
    clock[0] += 10
    assert [d.event.code for d in parser.feed(NVME_DOWN)] == ["nvme_controller_down"]  # the window has passed


async def test_the_async_iterator_yields_both_kinds_in_order():
    source = StaticSource([XID_LINE, LINK_DOWN, NVME_DOWN], kind="kmsg")
    collector = KernelLogCollector(source, host="h", poll_interval_s=0.01, clock=lambda: NOW)
    got = []
    async with asyncio.timeout(5):
        async for event in collector:
            got.append(event)
            if len(got) == 3:
                break
    collector.close()
    assert [e.code for e in got] == [79, "nic_link_down", "nvme_controller_down"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.data())
def test_any_text_parses_or_not_without_raising_and_what_parses_is_a_valid_event(noise, data):
    real = data.draw(st.sampled_from(real_lines()))
    for line in (noise, noise + real, real + noise):
        p = parse_host_line(line)
        if p is not None:
            assert CODES[p.code] == p.subsystem and (p.device is None or len(p.device) <= ID_MAX)
            HOST_EVENTS.check(HostEvent(host="h", ts=NOW, subsystem=p.subsystem, code=p.code, device=p.device,
                                        severity=p.severity, message=p.message, raw_line=line[:4096]).model_dump())
