"""Kernel-log transports (kmsg records, journald JSON, a rotating file) and the collector's lifecycle."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import orjson
import pytest

from agents.kernel_log import (FileSource, JournaldSource, KernelLogCollector, KmsgSource, Record, StaticSource,
                               nvml_gpu_map)
from agents.kernel_log.sources import parse_journal_json, parse_kmsg_record

XID79 = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
FALL_OFF_RECORD = ("4,2201,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed "
                   "in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n")


def test_kmsg_record_fields_escapes_and_dictionary_lines():
    seq, rec = parse_kmsg_record("3,512,365969681,-;" + XID79 + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:2b:00.0\n",
                                 boot_time=1000.0)
    assert (seq, rec.text, rec.ts) == (512, XID79, pytest.approx(1365.969681))
    _, multi = parse_kmsg_record(FALL_OFF_RECORD, boot_time=0.0)
    assert multi.text.count("\n") == 2 and multi.text.endswith("responding to commands.")
    _, slash = parse_kmsg_record("6,1,2,c;path C:\\x5cdir", boot_time=0.0)
    assert slash.text == "path C:\\dir"
    assert parse_kmsg_record("garbage without header", 0.0) is None
    assert parse_kmsg_record("x,y,z;msg", 0.0) is None


def test_kmsg_source_replays_or_tails_and_counts_lost_records(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,10,1000000,-;usb 1-1: new device\n" + "3,11,2000000,-;" + XID79 + "\n")
    replay = KmsgSource(str(path), replay=True, boot_time=500.0)
    assert replay.is_supported()
    assert [(r.text[:4], r.ts) for r in replay.read()] == [("usb ", 501.0), ("NVRM", 502.0)]
    tail = KmsgSource(str(path), boot_time=500.0)
    assert tail.is_supported() and tail.read() == []
    with open(path, "a") as f:
        f.write("3,12,3000000,-;" + XID79 + "\n" + FALL_OFF_RECORD.replace("2201", "13"))
    for source in (replay, tail):
        assert [r.ts for r in source.read()] == [503.0, 500.0 + 1843.308145] and source.lost == 0
    with open(path, "a") as f:
        f.write("6,20,4000000,-;after the ring overwrote 14..19\n")
    for source in (replay, tail):
        assert len(source.read()) == 1 and source.lost == 6
        source.close()


def test_kmsg_source_without_the_device_is_unsupported_not_an_error(tmp_path):
    source = KmsgSource(str(tmp_path / "missing"))
    assert source.is_supported() is False and "cannot read" in source.unsupported_reason


def test_journal_json_message_forms():
    line = orjson.dumps({"MESSAGE": XID79, "__REALTIME_TIMESTAMP": "1716058959123456", "_TRANSPORT": "kernel"})
    rec = parse_journal_json(line)
    assert (rec.text, rec.ts) == (XID79, pytest.approx(1716058959.123456))
    as_bytes = parse_journal_json(orjson.dumps({"MESSAGE": list(b"NVRM: \xff bad byte")}))
    assert as_bytes.text == "NVRM: \ufffd bad byte" and as_bytes.ts is None
    assert parse_journal_json(b"{not json") is None and parse_journal_json(b'{"MESSAGE": null}') is None


def _poll(read, want: int, timeout: float = 10.0) -> list[Record]:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += read()
        time.sleep(0.02)
    return got


def test_journald_source_follows_a_child_process_and_restarts_it():
    entries = [{"MESSAGE": XID79, "__REALTIME_TIMESTAMP": "1716058959000000"}, {"MESSAGE": "eth0: link up"}]
    script = "import sys\n" + "".join(f"print({orjson.dumps(e).decode()!r}, flush=True)\n" for e in entries)
    source = JournaldSource([sys.executable, "-c", script], restart_after_s=0.0)
    assert source.is_supported()
    first = _poll(source.read, 2)
    assert [r.text for r in first] == [XID79, "eth0: link up"] and first[0].ts == 1716058959.0
    again = _poll(source.read, 2)  # the child exited; the source starts it again
    assert [r.text for r in again] == [XID79, "eth0: link up"] and source.restarts >= 1
    source.close()


def test_journald_without_journalctl_is_unsupported():
    source = JournaldSource(["journalctl-that-does-not-exist", "-k"])
    assert source.is_supported() is False and "not found" in source.unsupported_reason


def test_file_source_tails_complete_lines_across_rotation_and_truncation(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("old line before the agent started\n")
    source = FileSource(path)
    assert source.is_supported() and source.read() == []
    with open(path, "a") as f:
        f.write("line B\nline C without newline yet")
    assert [r.text for r in source.read()] == ["line B"]
    with open(path, "a") as f:
        f.write(" ... now complete\n")
    assert [r.text for r in source.read()] == ["line C without newline yet ... now complete"]
    os.rename(path, tmp_path / "kern.log.1")  # logrotate: the writer still appends to the renamed file first
    with open(tmp_path / "kern.log.1", "a") as f:
        f.write("line D in the old file\n")
    assert [r.text for r in source.read()] == ["line D in the old file"]
    path.write_text("line E in the new file\n")
    assert [r.text for r in source.read()] == ["line E in the new file"] and source.rotations == 1
    path.write_text("F\n")  # copytruncate: same inode, smaller size
    assert [r.text for r in source.read()] == ["F"] and source.rotations == 2
    source.close()


def test_file_that_appears_later_is_read_from_its_start(tmp_path):
    path = tmp_path / "late.log"
    source = FileSource(path)
    assert source.is_supported() is False and source.read() == []
    path.write_text(XID79 + "\n")
    assert [r.text for r in source.read()] == [XID79]


def test_collector_samples_records_into_xid_events_with_gpu_identity():
    source = StaticSource([Record("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", 10.0),
                           Record(XID79, 11.0)], kind="kmsg")
    collector = KernelLogCollector(source, host="gpu-node-0004", rack="r2", gpu_index_by_pci={"0000:2b:00.0": 3})
    assert collector.name == "kernel_log" and collector.is_supported()
    (event,) = collector.sample()
    assert (event.host, event.rack, event.ts, event.code, event.gpu_index, event.gpu_uuid, event.source) == (
        "gpu-node-0004", "r2", 11.0, 79, 3, "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", "kmsg")
    multi_line = FALL_OFF_RECORD.split(";", 1)[1].replace("\\x0a", "\n").replace("b3:00", "2b:00")
    source.add(Record(multi_line, 12.0))  # one multi-line record (as journald keeps it)
    assert collector.sample() == []  # same GPU, same fault, inside the dedup window
    source.add(Record(XID79.replace("2b:00", "2c:00"), 13.0))
    assert [e.pci_bus_id for e in collector.sample()] == ["0000:2c:00.0"]
    collector.close()
    assert collector.sample() == []


def test_collector_with_no_supported_source_is_a_value(tmp_path):
    collector = KernelLogCollector(FileSource(tmp_path / "nope.log"), host="h")
    assert collector.is_supported() is False and "nope.log" in collector.unsupported_reason
    assert collector.sample() == []

    async def drain():
        return [e async for e in collector]

    assert asyncio.run(drain()) == []


async def test_collector_async_iteration_follows_a_file(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("")
    collector = KernelLogCollector(FileSource(path), host="h", poll_interval_s=0.01)

    async def writer():
        await asyncio.sleep(0.05)
        with open(path, "a") as f:
            f.write("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, "
                    "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005\n")

    task = asyncio.create_task(writer())
    async with asyncio.timeout(5):
        async for event in collector:
            break
    await task
    collector.close()
    assert (event.code, event.pid, event.source) == (109, 1797828, "file")


def test_nvml_map_is_empty_without_a_gpu_and_normalised_with_one():
    index_by_pci, uuid_by_pci = nvml_gpu_map()
    assert set(index_by_pci) == set(uuid_by_pci)
    assert sorted(index_by_pci.values()) == list(range(len(index_by_pci)))
    assert all(len(p) == 12 and p == p.lower() and u.startswith("GPU-") for p, u in uuid_by_pci.items())
