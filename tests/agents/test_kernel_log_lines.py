"""parse_line on the real XID/SXid lines of the reference files, every §2 variant, and generated lines."""

from __future__ import annotations

import csv
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st

from agents.kernel_log import normalize_pci, parse_line
from schemas.xid_catalog import first_bin

# Catalog action -> bin, restated independently of schemas.xid_catalog (the workflow buckets need the line).
ACTION_BIN = {"RESTART_BM": "reboot", "RESTART_APP": "retry", "RESET_GPU": "reset", "IGNORE": "ignore",
              "WORKFLOW_NVLINK_ERR": "reset", "WORKFLOW_XID_48": "reset"}


def sample_rows(reference_dir):
    with open(reference_dir / "xid_lines_sample.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_every_reference_sample_line_parses_to_its_code_kind_pci_and_bin(reference_dir):
    rows = sample_rows(reference_dir)
    assert len(rows) == 20
    for row in rows:
        p = parse_line(row["line"])
        assert p is not None, row["line"]
        assert (p.kind, p.code, p.pci_bus_id) == (row["kind"], int(row["code"]), row["pci"] + ".0"), row["line"]
        bin_, action = first_bin(p.code, p.kind, severity=p.severity, caused_by=p.caused_by,
                                 recovery_action=p.recovery_action)
        assert action == row["catalog_action"]
        if action == "WORKFLOW_XID_45":
            expected = first_bin(p.caused_by)[0].value if p.caused_by else "ignore"
        elif action == "XID_154":
            expected = {0: "ignore", 1: "reset", 2: "reboot"}[p.recovery_action]
        else:
            expected = ACTION_BIN[action]
        assert bin_.value == expected, row["line"]
        assert row["line"].endswith(p.message) and (p.message.startswith("pid=") or p.pid is None)


def test_sample_line_details(reference_dir):
    by_code = {}
    for row in sample_rows(reference_dir):
        by_code.setdefault(int(row["code"]), []).append(parse_line(row["line"]))
    xid13 = by_code[13][0]
    assert (xid13.pid, xid13.process) == (None, None)  # pid='<unknown>', name=<unknown>
    assert xid13.wall_ts == datetime(2024, 8, 30, 11, 43, 9).timestamp()
    xid109 = by_code[109][0]
    assert (xid109.pid, xid109.process, xid109.channel) == (1797828, "pt_main_thread", 8)
    caused = [p for p in by_code[45] if p.caused_by]
    assert len(caused) == 1 and (caused[0].caused_by, caused[0].channel, caused[0].process) == (145, 2, "python3")
    assert (by_code[154][0].recovery_action, by_code[154][0].recovery_label) == (1, "GPU Reset Required")
    xid63 = by_code[63][0]
    assert (xid63.log_host, xid63.syslog_stamp, xid63.uptime_s, xid63.pid) == (
        "ip-26-0-146-100", "May 19 07:08:57", 680111.646286, 1850)
    assert by_code[31][1].channel == 0x0C and by_code[31][1].process == "UnrealEditor"  # 'channel 0x0000000c'
    assert by_code[31][0].uptime_s == 31543.449443 and by_code[31][0].pid is None
    assert [p.link for p in by_code[74]] == [14, 1]
    assert by_code[74][0].registers == (0, 0, 0x10000, 0, 0, 0, 0)
    assert by_code[62][0].pid is None and by_code[62][1].pid == 213710


@pytest.mark.parametrize("line, expected", [
    # REFERENCE.md §2 variants, verbatim where the table quotes a whole line
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", dict(code=14, pci_bus_id="0000:03:00.0", channel=1)),
    ("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff", dict(code=3, channel=None)),
    ("NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000", dict(code=31, channel=3)),
    ("NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000052 intr 02000000", dict(code=32, channel=0x52)),
    ("NVRM: Xid (PCI:0000:0c:00): 31, pid=11461, Ch 00000053, intr 10000000. MMU Fault: ...",
     dict(pid=11461, process=None, channel=0x53)),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     dict(code=94, gpu_instance=5, pid=7194, pci_bus_id="0000:01:00.0")),
    ("NVRM: Xid (PCI:0000:ba:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     dict(code=45, caused_by=149, channel=1, process="python3")),
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 ...)",
     dict(pci_bus_id="0019:01:00.0", unit="NETIR", severity="Fatal", link=-1, registers=(0xFE406, 0))),
    ("NVRM: Xid (PCI:0000:9a:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 "
     "0x00000000 0x00100000 0x00000004)",
     dict(unit="RLW_RXPIPE", severity="Nonfatal", link=13, registers=(0x0409A0C2, 8, 1, 0, 0x100000, 4))),
    ("NVRM: Xid (PCI:0004:01:00.0): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     dict(pci_bus_id="0004:01:00.0", recovery_action=2, recovery_label="Node Reboot Required")),
    ("NVRM: Xid (PCI:0000:2b:00.1): 79, GPU has fallen off the bus.", dict(pci_bus_id="0000:2b:00.1")),
    ("kern  :err   : 2025-01-25T10:34:54,859532+00:00 NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     dict(wall_ts=datetime(2025, 1, 25, 10, 34, 54, 859532, tzinfo=timezone.utc).timestamp())),
    ("[  130.456250] [ T1946] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     dict(uptime_s=130.45625, wall_ts=None)),
    ("2025-03-01T08:00:01.250000+01:00 gpu-07 kernel: NVRM: Xid (PCI:0000:2b:00): 48, An uncorrectable double bit",
     dict(code=48, log_host="gpu-07",
          wall_ts=datetime(2025, 3, 1, 7, 0, 1, 250000, tzinfo=timezone.utc).timestamp())),
    ("XID 63 Dynamic Page Retirement: New retired page, reload the driver to activate. (0x000000000123f000)",
     dict(code=63, pci_bus_id=None)),
    # SXid: gpud's examples (leptonai/gpud nvidia-query/sxid) and the Fabric Manager guide's three-line report
    ("[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
     "error (First)", dict(kind="sxid", code=12028, severity="Non-fatal", link=32, device="nvswitch3")),
    ("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     dict(kind="sxid", code=20034, pci_bus_id="0000:a9:00.0", severity="Fatal", uptime_s=131453.740743)),
    ("[...] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
     dict(kind="sxid", code=28006, link=46)),
])
def test_reference_variants(line, expected):
    p = parse_line(line)
    assert p is not None
    assert {k: getattr(p, k) for k in expected} == expected


@pytest.mark.parametrize("line", [
    "[...] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 Sub-engine instance 00",
    "[...] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000, 0x00140004, 0x00000000}",
    "NVRM: Xid (PCI:0000:01:00): 1234567890, too long to be a code",
    "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "",
])
def test_lines_that_are_not_events(line):
    assert parse_line(line) is None


def test_no_context_line_parses_as_an_xid_line(reference_dir):
    lines = [l.split("\t")[0] for l in (reference_dir / "xid_context_lines.tsv").read_text().splitlines()
             if l and not l.startswith("#")]
    assert len(lines) == 18
    assert [parse_line(l) for l in lines] == [None] * 18


@pytest.mark.parametrize("raw, expected", [
    ("0000:2b:00", "0000:2b:00.0"), ("00000000:2B:00.0", "0000:2b:00.0"), ("0019:01:00.3", "0019:01:00.3"),
    ("2b:00.0", "0000:2b:00.0"), ("0000:10:1c", "0000:10:1c.0"),
])
def test_normalize_pci(raw, expected):
    assert normalize_pci(raw) == expected


FRAGMENTS = ["NVRM: Xid (", "PCI:", "0000:2b:00", ".0", " GPU-I:05", "): ", "79", ", ", "pid=", "'<unknown>'",
             "name=", "Ch 0000000c", "caused by previous Xid ", "154", "GPU recovery action changed from 0x0 (None) "
             "to 0x", "NETIR Fatal XC0 i0 Link ", "-1", " (0x1 0x2)", "SXid (", "Non-fatal", "Link 3 ", "XID ",
             "[ 12.5] ", "[Fri Aug 30 11:43:09 2024] ", "May 18 19:02:39 h kernel: ", "2025-13-45T99:99:99,1+00:00 ",
             "Feb 30 10:00:00 h kernel: ", "NVLink: fatal error detected on link ", "(0x0, 0x", ")"]


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=14)
                 .map("".join)))
def test_parse_line_never_raises(text):
    p = parse_line(text)
    assert p is None or (p.kind in ("xid", "sxid") and 0 <= p.code < 10**9)


DOW = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@st.composite
def xid_lines(draw):
    """A well-formed line with a random prefix, PCI id, MIG instance, pid, name, channel, body and cause."""
    when = draw(st.datetimes(min_value=datetime(2015, 1, 1), max_value=datetime(2035, 1, 1))).replace(microsecond=0)
    uptime = draw(st.integers(0, 10**9)) / 1e6
    prefixes = {
        "none": ("", {}),
        "dmesg": (f"[{uptime:12.6f}] ", {"uptime_s": uptime}),
        "dmesg_t": (f"[{DOW[when.weekday()]} {MON[when.month - 1]} {when.day:2d} {when:%H:%M:%S} {when.year}] ",
                    {"wall_ts": when.timestamp()}),
        "syslog": (f"{MON[when.month - 1]} {when.day:2d} {when:%H:%M:%S} node-{draw(st.integers(0, 99))} kernel: ",
                   {"syslog_stamp": f"{MON[when.month - 1]} {when.day:2d} {when:%H:%M:%S}"}),
        "iso": (f"kern  :err   : {when:%Y-%m-%dT%H:%M:%S},{draw(st.integers(0, 999999)):06d}+00:00 ", {}),
        "caller": (f"[{uptime:12.6f}] [ T{draw(st.integers(1, 99999))}] ", {"uptime_s": uptime}),
    }
    prefix, stamp = prefixes[draw(st.sampled_from(sorted(prefixes)))]
    domain, bus, dev = draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFF)), draw(st.integers(0, 0x1F))
    fn = draw(st.none() | st.integers(0, 7))
    pci = f"{domain:04x}:{bus:02x}:{dev:02x}" + (f".{fn}" if fn is not None else "")
    gi = draw(st.none() | st.integers(0, 14))
    code = draw(st.integers(1, 999))
    parts, fields = [], {"code": code, "pci_bus_id": f"{domain:04x}:{bus:02x}:{dev:02x}.{fn or 0}", "gpu_instance": gi}
    pid = draw(st.sampled_from(["absent", "unknown"]) | st.integers(1, 4_194_304))
    if pid != "absent":
        parts.append("pid='<unknown>'" if pid == "unknown" else f"pid={pid}")
        name = draw(st.none() | st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,14}", fullmatch=True))
        parts.append(f"name={name}" if name else "name=<unknown>")
        fields.update(pid=None if pid == "unknown" else pid, process=name)
    channel = draw(st.none() | st.integers(0, 0xFFFFFFFF))
    body = draw(st.text(alphabet="ghijklmnopqrstuvwxyz .:", min_size=1, max_size=40).filter(lambda s: s.strip()))
    parts.append((f"Ch {channel:08x}, " if channel is not None else "") + body)
    fields["channel"] = channel
    cause = draw(st.none() | st.integers(1, 999))
    message = ", ".join(parts) + (f" caused by previous Xid {cause}" if cause else "")
    fields.update(caused_by=cause, message=message, **stamp)
    head = f"NVRM: Xid ({draw(st.sampled_from(['PCI:', '']))}{pci}{f' GPU-I:{gi:02d}' if gi is not None else ''})"
    return f"{prefix}{head}: {code}, {message}", fields


@settings(max_examples=500, deadline=None)
@given(xid_lines())
def test_generated_lines_parse_back_to_the_same_fields(case):
    line, fields = case
    p = parse_line(line)
    assert p is not None and p.kind == "xid"
    assert {k: getattr(p, k) for k in fields} == fields
