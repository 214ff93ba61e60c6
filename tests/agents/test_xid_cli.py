"""`fleetpulse xid parse|classify` as a user runs it: a subprocess over the reference sample."""

from __future__ import annotations

import csv
import subprocess
import sys

import orjson
import pytest

CLI = [sys.executable, "-m", "fleetpulse.cli", "xid"]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def sample(reference_dir, tmp_path):
    with open(reference_dir / "xid_lines_sample.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    log = tmp_path / "kern.log"
    log.write_text("".join(r["line"] + "\n" for r in rows))
    return rows, log


def test_parse_prints_one_json_object_per_sample_line(sample):
    rows, log = sample
    proc = run_cli("parse", str(log), "--host", "gpu-node-0009")
    assert proc.returncode == 0, proc.stderr
    out = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(rows) == 20
    for row, obj in zip(rows, out):
        assert (obj["kind"], obj["code"], obj["pci_bus_id"], obj["catalog_action"]) == (
            row["kind"], int(row["code"]), row["pci"] + ".0", row["catalog_action"])
        assert obj["host"] == "gpu-node-0009" and obj["raw_line"] == row["line"] and obj["bin"] in (
            "ignore", "retry", "reset", "reboot", "inspect")
    assert [o["line"] for o in out] == list(range(1, 21))
    by_line = {o["line"]: o for o in out}
    assert (by_line[3]["pid"], by_line[3]["process"], by_line[3]["bin"]) == (1797828, "pt_main_thread", "reset")
    assert (by_line[4]["caused_by"], by_line[4]["bin"]) == (145, "reset")
    assert (by_line[12]["recovery_action"], by_line[12]["recovery_label"], by_line[12]["bin"]) == (
        1, "GPU Reset Required", "reset")
    assert "20 lines, 20 events, 0 repeats" in proc.stderr


def test_parse_prints_only_the_xid_events_of_a_log_with_host_lines(sample):
    rows, log = sample
    host = ("mlx5_core 0000:1a:00.0: poll_health:955:(pid 0): device's health compromised - reached miss count\n"
            "nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff\n")
    proc = run_cli("parse", stdin=host + log.read_text())
    assert proc.returncode == 0, proc.stderr
    assert [orjson.loads(line)["line"] for line in proc.stdout.splitlines()] == list(range(3, 23))


def test_parse_reads_stdin_and_counts_repeats(sample, reference_dir):
    rows, log = sample
    context = (reference_dir / "xid_context_lines.tsv").read_text().splitlines()
    text = log.read_text() * 2 + "".join(l.split("\t")[0] + "\n" for l in context if not l.startswith("#"))
    proc = run_cli("parse", stdin=text)
    assert proc.returncode == 0, proc.stderr
    out = [orjson.loads(line) for line in proc.stdout.splitlines()]
    fell_off = [o["pci_bus_id"] for o in out if o["fell_off_text"]]
    # the second copy repeats all 20; 2b's fall-off text repeats the sample's Xid 79 for it (same second)
    assert len(out) == 23 and fell_off == ["0000:06:00.0", "0000:b3:00.0", "0000:01:00.0"]
    assert "58 lines, 23 events, 21 repeats not printed, 4 GPU UUIDs learned" in proc.stderr


def test_classify_prints_entry_bin_and_action():
    proc = run_cli("classify", "79")
    assert proc.returncode == 0, proc.stderr
    obj = orjson.loads(proc.stdout)
    assert (obj["bin"], obj["catalog_action"], obj["entry"]["mnemonic"]) == (
        "reboot", "RESTART_BM", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    nvlink5 = orjson.loads(run_cli("classify", "145", "--severity", "Nonfatal").stdout)
    assert (nvlink5["bin"], nvlink5["catalog_action"]) == ("ignore", "WORKFLOW_NVLINK5_ERR")
    recovery = orjson.loads(run_cli("classify", "154", "--recovery-action", "2").stdout)
    assert (recovery["bin"], recovery["recovery_action"]) == ("reboot", "NODE_REBOOT")
    sxid = orjson.loads(run_cli("classify", "12028", "--kind", "sxid").stdout)
    assert (sxid["bin"], sxid["catalog_action"], sxid["entry"]) == ("reset", "RESET_FABRIC", None)


def test_bad_input_is_an_error_message_not_a_traceback(tmp_path):
    bad = run_cli("classify", "seventy-nine")
    assert bad.returncode == 2 and "integer code" in bad.stderr and "Traceback" not in bad.stderr
    missing = run_cli("parse", str(tmp_path / "absent.log"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
