"""Reading `scontrol -o show node` (lines recorded from Debian's slurmctld 22.05) and the bot's own drain reasons."""

from __future__ import annotations

import pytest

from bots.slurm.nodes import NODE_NAME, drain_reason, parse_show_node

HEAD = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.53 "
        "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=26821 "
        "Version=22.05.8 OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=19471 "
        "Sockets=1 Boards=1 ")
TAIL = ("ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-12-02T12:00:20 "
        "SlurmdStartTime=2026-12-03T06:17:34 LastBusyTime=2026-12-03T06:17:45 CfgTRES=cpu=1,mem=1M,billing=1 "
        "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")


def line(state: str, reason: str = "") -> str:
    return f"{HEAD}State={state} {TAIL}" + (f" Reason={reason}" if reason else "")


@pytest.mark.parametrize("state, drained, out", [
    ("IDLE", False, False),
    ("ALLOCATED+DRAIN", False, True),  # DRAINING: its job still runs
    ("MIXED+DRAIN", False, True),
    ("IDLE+DRAIN+COMPLETING", False, True),
    ("IDLE+DRAIN", True, True),  # DRAINED
    ("DOWN", True, True),  # back from `scontrol reboot ... nextstate=DOWN`
    ("DOWN+DRAIN+REBOOT_ISSUED", True, True),
    ("IDLE*", False, False),
])
def test_drained_means_out_of_service_with_nothing_running(state, drained, out):
    node = parse_show_node(line(state))
    assert (node.drained, node.out_of_service) == (drained, out)


def test_flags_and_marks_are_read_from_the_state():
    node = parse_show_node(line("DOWN+DRAIN+REBOOT_ISSUED"))
    assert node.state == "DOWN" and node.flags == {"DRAIN", "REBOOT_ISSUED"} and node.rebooting
    assert not parse_show_node(line("IDLE*")).responding
    assert parse_show_node(line("IDLE+NOT_RESPONDING")).flags == {"NOT_RESPONDING"}
    assert parse_show_node(line("IDLE")).boot_time == "2026-12-02T12:00:20"


def test_an_own_reason_keeps_its_event_id_under_slurm_s_notes():
    node = parse_show_node(line("DOWN", "fleetpulse: reboot xid:79 gpu3 ev-1a2b : reboot issued : reboot complete "
                                        "[root@2026-12-03T06:20:56]"))
    assert node.ours and node.event_id == "ev-1a2b"
    assert node.reason_by == "root" and node.reason_at == "2026-12-03T06:20:56"


def test_someone_else_s_reason_is_theirs_whole():
    node = parse_show_node(line("IDLE+DRAIN", "admin: bad fan  x=1 [slurm@2026-12-03T06:18:57]"))
    assert not node.ours and node.event_id == ""
    assert node.owner == "slurm at 2026-12-03T06:18:57: admin: bad fan  x=1"


def test_a_line_that_is_no_node_is_refused():
    with pytest.raises(ValueError, match="not a node line"):
        parse_show_node("Node nope not found")


def test_the_drain_reason_names_repair_evidence_and_event_last():
    event = {"event_id": "ev-9", "evidence": {"repair": "reset", "mode": "immediate", "code": "xid:48",
                                              "gpu_index": "2", "gates": "gpu2/ecc_dbe [pending]"}}
    assert drain_reason(event) == "fleetpulse: reset xid:48 gpu2 gpu2/ecc_dbe_pending_ ev-9"
    assert drain_reason({"event_id": "ev-1"}) == "fleetpulse: inspect ev-1"
    tray = {"event_id": "t7:1:p1:drain", "evidence": {"repair": "reboot", "code": "fabric_failed", "gpu_index": "0",
                                                       "incident": "6f3c0a1e-0000-4000-8000-000000000001/7"}}
    assert drain_reason(tray) == ("fleetpulse: reboot fabric_failed gpu0 domain=6f3c0a1e-0000-4000-8000-000000000001/7 "
                                  "t7:1:p1:drain")
    assert parse_show_node(line("IDLE+DRAIN", drain_reason(tray) + " [root@2026-12-07T01:58:00]")).event_id == \
        "t7:1:p1:drain"
    node = parse_show_node(line("IDLE+DRAIN", drain_reason(event) + " [root@2026-12-03T06:18:57]"))
    assert node.ours and node.event_id == "ev-9"


def test_a_reason_that_quotes_a_state_does_not_change_the_node_s():
    node = parse_show_node(line("ALLOCATED+DRAIN", "admin: was State=IDLE NodeName=n9 [root@2026-12-03T06:18:57]"))
    assert (node.name, node.state, node.flags) == ("n1", "ALLOCATED", {"DRAIN"})


@pytest.mark.parametrize("name, one", [("gpu-0042", True), ("n1.rack3", True), ("gpu[001-128]", False),
                                       ("a,b", False), ("-x", False), ("", False), ("n 1", False)])
def test_a_host_names_one_node_or_none(name, one):
    assert bool(NODE_NAME.fullmatch(name)) is one
