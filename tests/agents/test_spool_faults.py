"""The spool under faults: a full disk (a real tmpfs of 256 KiB), flipped bytes in records and in length fields, damage
that appears while the agent runs; and the agent itself on a full disk with its broker away."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from agents.spool import Spool, SpoolUnwritable
from agents.spool.record import FRAME
from tests.agents.test_agent_cli import AGENT, agent_env
from tests.agents.test_spool import drain, rec, seqs
from tests.conftest import REPO, _free_port


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs: a disk that really fills up (mounting needs root, as CI runs)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): these tests need root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_the_record_and_leaves_the_spool_whole(tiny_disk):
    spool = Spool(tiny_disk / "spool", max_bytes=64 << 20, segment_bytes=16 << 10, fsync="never")
    taken = 0
    with pytest.raises(SpoolUnwritable, match="No space left on device"):
        for i in range(10_000):
            spool.append(rec(i, size=1000))
            taken += 1
    assert 100 < taken < 300 and len(spool) == taken
    for i in range(taken, taken + 5):  # still full: refused again, nothing half-written
        with pytest.raises(SpoolUnwritable):
            spool.append(rec(i, size=1000))
    assert seqs(drain(spool, batch=50)) == list(range(taken))  # every record taken is intact, in order
    spool.append(rec(99_999, size=1000))  # delivered segments are gone: room again
    assert seqs(drain(spool)) == [99_999]
    spool.close()


def test_the_spool_opens_on_a_full_disk(tiny_disk):
    spool = Spool(tiny_disk / "spool", fsync="never")
    for i in range(20):
        spool.append(rec(i, size=1000))
    spool.commit(spool.peek(5)[-1])
    spool.close()
    filler = tiny_disk / "filler"
    with open(filler, "wb", buffering=0) as f, pytest.raises(OSError, match="No space"):
        while True:
            f.write(b"\0" * 4096)
    again = Spool(tiny_disk / "spool", fsync="never")  # the agent must start on a full disk
    assert seqs(drain(again)) == list(range(5, 20))
    assert again.cursor_errors >= 1  # a cursor it could not write costs a replay after a restart, never a record
    again.close()


def segment_with(tmp_path: Path, n: int) -> tuple[Path, list[int]]:
    spool = Spool(tmp_path, segment_bytes=1 << 20)
    for i in range(n):
        spool.append(rec(i))
    spool.close()
    (segment,) = tmp_path.glob("seg-*.spool")
    frame = len(rec(0).encode())
    return segment, [k * frame for k in range(n)]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where, lost", [("payload", [4]), ("length", [4]), ("crc", [4])])
def test_a_flipped_byte_costs_only_the_record_it_hit(tmp_path, where, lost):
    segment, starts = segment_with(tmp_path, 10)
    offset = {"payload": FRAME.size + 20, "length": 1, "crc": 5}[where]
    flip(segment, starts[4] + offset)
    again = Spool(tmp_path)
    assert again.corrupt == 1 and len(again) == 9
    assert seqs(drain(again)) == [i for i in range(10) if i not in lost]


def test_damage_that_appears_while_running_is_caught_by_the_crc_on_read(tmp_path):
    spool = Spool(tmp_path, segment_bytes=1 << 20)
    for i in range(10):
        spool.append(rec(i))
    spool.commit(spool.peek(2)[-1])
    (segment,) = tmp_path.glob("seg-*.spool")
    frame = len(rec(0).encode())
    flip(segment, 6 * frame + FRAME.size + 3)  # bit rot under a running agent, in record 6
    first = spool.peek(10)
    assert seqs([s.record for s in first]) == [2, 3, 4, 5]  # intact records before the damage, in order
    spool.commit(first[-1])
    spool.append(rec(10))  # the tail segment was rewritten: appends go on into a new one
    assert seqs(drain(spool)) == [7, 8, 9, 10] and spool.corrupt == 1
    spool.close()
    assert len(Spool(tmp_path)) == 0


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.findall(rf"^{name}(?:_total)?\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in found)


def test_the_agent_keeps_sampling_on_a_full_disk_with_its_broker_away(tiny_disk, tmp_path):
    port = _free_port()
    env = agent_env(tmp_path, FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{_free_port()}",  # nothing listens
                    FLEETPULSE_AGENT_SPOOL_DIR=str(tiny_disk / "spool"), FLEETPULSE_AGENT_INTERVAL_S="0.05",
                    FLEETPULSE_AGENT_SPOOL_FSYNC="never", FLEETPULSE_AGENT_METRICS_PORT=str(port))
    proc = subprocess.Popen([*AGENT, "--fake-nvml"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline, dropped = time.monotonic() + 90, 0.0
        while time.monotonic() < deadline and dropped < 20:
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            time.sleep(0.5)
            try:
                dropped = metric(port, "fleetpulse_agent_spool_dropped")
            except OSError:
                continue
        polls = metric(port, "fleetpulse_agent_collector_polls")
        time.sleep(1.5)
        assert dropped >= 20 and metric(port, "fleetpulse_agent_collector_polls") > polls  # still sampling
        assert metric(port, "fleetpulse_agent_errors") == 0
        assert os.statvfs(tiny_disk).f_bavail * os.statvfs(tiny_disk).f_frsize < 16 << 10  # the disk is full
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert b"No space left on device" in err and b"records dropped so far" in err
