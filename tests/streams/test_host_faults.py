"""Faults of the host around its GPUs: InfiniBand/RoCE port samples and kernel-log host lines, through the fault-bin
rules as the stage runs them (state only as JSON between batches)."""

from __future__ import annotations

import pytest

from schemas.analytics import FaultBin
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_rules import HOST_EVENT_BINS, apply_net
from streams.fault_bins.host_state import HostState
from streams.fault_bins.rules import check_record
from tests.streams.test_fault_bins import Table

TS0 = 1_700_000_000.0
UP = {"state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0, "rate": "400 Gb/sec (4X NDR)"}
DOWN = {"state": "DOWN", "phys_state": "Disabled", "rate_gbps": 10.0, "rate": "10 Gb/sec (4X SDR)"}


def port(device: str = "mlx5_0", **fields) -> dict:
    return {"device": device, "port": 1, "link_layer": "InfiniBand", **UP, "symbol_error": 0, "link_downed": 0,
            "link_error_recovery": 0, "port_rcv_errors": 0, **fields}


def net(ts: float, *ports: dict, host: str = "h1", seq: int = 0) -> tuple[str, dict]:
    ports = ports or (port(),)
    return check_record({"host": host, "rack": "r1", "ts": ts, "seq": seq, "ports": list(ports)}, "net")


def event(ts: float, code: str, subsystem: str = "nic", device: str | None = "0000:1a:00.0", host: str = "h1",
          **fields) -> tuple[str, dict]:
    return check_record({"host": host, "rack": "r1", "ts": ts, "subsystem": subsystem, "code": code,
                         "device": device, "raw_line": f"a {code} line", **fields}, "host_event")


def feed_each(table: Table, records) -> Table:
    for r in records:
        table.feed([r])
    return table


def test_a_link_that_goes_down_and_stays_down_is_inspected_once_with_its_readings():
    t = feed_each(Table(), [net(TS0 + 10 * k, port(**(DOWN if k >= 3 else {}), link_downed=int(k >= 3)))
                            for k in range(14)])
    [f] = t.faults[1:]  # the drop itself first (ib_link_flap, retry), then a minute down
    assert (t.faults[0].code, t.faults[0].bin) == ("ib_link_flap", "retry")
    assert (f.code, f.bin, f.rule, f.host, f.gpu_index, f.ts) == ("ib_link_down", "inspect", "ib_link_down", "h1",
                                                                   None, TS0 + 90)
    assert f.evidence["state"] == "DOWN" and f.evidence["phys_state"] == "Disabled" and f.evidence["samples"] == "7"
    assert f.evidence["down_since"] == f"{TS0 + 30:.3f}" and "was ACTIVE" in f.reasons[0]


def test_a_link_down_for_less_than_link_down_s_is_only_its_drop():
    t = feed_each(Table(), [net(TS0 + 10 * k, port(**(DOWN if 3 <= k < 8 else {}), link_downed=int(k >= 3)))
                            for k in range(14)])
    assert [(f.code, f.bin) for f in t.faults] == [("ib_link_flap", "retry")]


def test_a_port_never_up_since_start_and_one_training_after_a_reboot_are_not_faults():
    never = [net(TS0 + 10 * k, port(**DOWN), port("mlx5_1")) for k in range(5)]
    t = feed_each(Table(), never)
    # the host comes back after 10 min: its ports train (INIT, Polling) before they are ACTIVE again
    training = {"state": "INIT", "phys_state": "LinkUp"}
    back = [net(TS0 + 700 + 10 * k, port(**DOWN), port("mlx5_1", **(training if k < 4 else {}))) for k in range(6)]
    feed_each(t, back)
    assert t.faults == []


def test_one_flap_is_recorded_and_the_third_within_the_hour_goes_to_a_person():
    downed = [0, 0, 1, 1, 2, 2, 2, 3, 3]
    t = feed_each(Table(), [net(TS0 + 30 * k, port(link_downed=d)) for k, d in enumerate(downed)])
    assert [(f.code, f.bin, f.evidence["flaps"]) for f in t.faults] == [
        ("ib_link_flap", "retry", "1"), ("ib_link_flap", "inspect", "3")]  # the second retry folds into the first
    assert t.faults[-1].evidence["link_downed"] == "3" and "3 drops within 60 min" in t.faults[-1].reasons[0]
    assert "lost its link (link_downed 0 -> 1, back up)" in t.faults[0].reasons[0]


def test_flaps_an_hour_apart_stay_recorded_and_a_reboot_resetting_the_counter_is_no_flap():
    cfg = FaultBinConfig(flap_window_s=600)
    downed = [(0, 0), (100, 1), (800, 2), (1500, 3), (1530, 0), (1560, 0)]  # counter back to 0: a reboot
    t = feed_each(Table(cfg), [net(TS0 + s, port(link_downed=d)) for s, d in downed])
    assert {f.bin for f in t.faults} == {"retry"}


def test_a_link_running_below_the_rate_it_ran_at_is_degraded():
    rates = [400, 400] + [200] * 10
    t = feed_each(Table(), [net(TS0 + 10 * k, port(rate_gbps=r, rate=f"{r} Gb/sec (4X)")) for k, r in enumerate(rates)])
    [f] = t.faults
    assert (f.code, f.bin, f.ts, f.evidence["best_gbps"]) == ("ib_rate_degraded", "inspect", TS0 + 80, "400.0")


def test_physical_layer_errors_above_the_rate_are_inspected_and_a_trickle_is_not():
    trickle = [net(TS0 + 60 * k, port(symbol_error=k)) for k in range(12)]
    assert feed_each(Table(), trickle).faults == []
    burst = [net(TS0 + 60 * k, port(symbol_error=40 * k, link_error_recovery=k)) for k in range(3)]
    [f] = feed_each(Table(), burst).faults
    assert (f.code, f.bin, f.evidence["errors"]) == ("ib_phy_errors", "inspect", "82")
    assert "symbol_error +80, link_error_recovery +2" in f.reasons[0]


def test_a_steady_port_keeps_one_baseline_marks_nothing_changed_and_still_catches_a_late_burst():
    st, cfg = HostState(), FaultBinConfig()
    steady = [net(TS0 + 30 * k, port(symbol_error=5))[1] for k in range(40)]  # 20 minutes of the same counts
    for k, s in enumerate(steady):
        st.dirty = False
        assert apply_net(st, "h1", s, cfg) == []
        assert st.dirty == (k == 0), k  # the first reading is new; the rest only refresh times (flushed periodically)
    assert [t for t, _ in st.ports["mlx5_0/1"].errs] == [TS0 + 30 * 39]
    [f] = apply_net(st, "h1", net(TS0 + 30 * 40, port(symbol_error=70))[1], cfg)
    assert (f.code, f.evidence["errors"], f.evidence["window_s"]) == ("ib_phy_errors", "65", "30")


def test_two_ports_are_judged_apart():
    t = feed_each(Table(), [net(TS0 + 10 * k, port(), port("mlx5_3", **(DOWN if k else {}))) for k in range(9)])
    [f] = t.faults
    assert f.evidence["device"] == "mlx5_3" and f.fault_id


def test_replayed_port_samples_change_nothing():
    records = [net(TS0 + 10 * k, port(link_downed=min(k, 3))) for k in range(6)]
    once = feed_each(Table(), records)
    twice = feed_each(Table(), records[:4] + records)
    assert [f.model_dump() for f in twice.faults] == [f.model_dump() for f in once.faults]


@pytest.mark.parametrize("code", sorted(HOST_EVENT_BINS))
def test_every_host_line_code_has_its_bin_with_the_line_as_evidence(code):
    subsystem = ("nic" if code.startswith(("mlx5", "nic")) else "storage" if code.startswith(("nvme", "storage",
                 "block")) else "filesystem" if code.startswith("fs") else "machine_check")
    [f] = Table().feed([event(TS0, code, subsystem, device="dev0")])
    assert (f.code, f.bin, f.rule, f.gpu_index) == (code, HOST_EVENT_BINS[code][0].value, "host_event", None)
    assert f.evidence["raw_line"] == f"a {code} line" and f.evidence["device"] == "dev0"


def test_an_unknown_host_code_is_recorded_and_never_drains_and_a_replayed_line_counts_once():
    t = Table()
    t.feed([event(TS0, "mlx5_something_new")])
    t.feed([event(TS0, "mlx5_something_new")])  # the same line again (a replay)
    t.feed([event(TS0 + 1, "mlx5_health_compromised", severity="fatal")])
    assert [(f.code, f.bin) for f in t.faults] == [("mlx5_something_new", FaultBin.IGNORE.value),
                                                   ("mlx5_health_compromised", "reboot")]
    assert t.stats["replayed"] == 1


def test_a_late_host_line_is_not_taken_for_a_replay_of_the_xid_stream():
    from tests.streams.test_fault_bins import LINE_79, xid
    t = Table()
    t.feed([xid(LINE_79, TS0 + 100)])
    t.feed([event(TS0 + 50, "nvme_controller_down", "storage", device="nvme0")])  # its topic was behind
    assert [f.code for f in t.faults] == ["xid:79", "nvme_controller_down"]


def test_host_faults_are_not_escalated_as_a_gpus_history_and_leave_no_gpu_memory():
    t = Table()
    t.feed([event(TS0 + 3600 * k, "mlx5_health_compromised") for k in range(3)] +
           [event(TS0 + 100 * k, "fs_readonly", "filesystem", device="nvme0n1p1") for k in range(3)])
    assert {f.bin for f in t.faults} == {"reboot"}  # the node's recurrence is the lifecycle's repeat-offender rule
    assert t.data["h1"]["gpus"] == {}


def test_a_reboot_that_keeps_the_drop_counter_is_no_flap_and_a_port_training_after_it_no_link_down():
    early = [net(TS0 + 30 * k, port(link_downed=2), seq=k) for k in range(3)]
    # the agent restarted (seq from 0 again, 40 s later): the boot's retraining bumped link_downed; INIT for 90 s
    booted = [net(TS0 + 100 + 30 * k, port(link_downed=3, **({"state": "INIT"} if k < 4 else {})), seq=k)
              for k in range(6)]
    assert feed_each(Table(), early + booted).faults == []


def test_a_port_that_vanishes_from_the_sample_is_down_and_a_counter_turning_readable_is_no_burst():
    t = feed_each(Table(), [net(TS0 + 30 * k, port(), port("mlx5_1"), seq=k) for k in range(2)] +
                  [net(TS0 + 60 + 30 * k, port(), seq=2 + k) for k in range(4)])
    [f] = t.faults
    assert (f.code, f.evidence["device"], f.evidence["state"]) == ("ib_link_down", "mlx5_1", "missing")
    assert "missing from the host's port sample" in f.reasons[0]
    readable = [net(TS0, port(port_rcv_errors=None)), net(TS0 + 30, port(port_rcv_errors=5000), seq=1)]
    assert feed_each(Table(), readable).faults == []


def test_a_sample_that_reads_one_port_twice_is_refused():
    from core.errors import DecodeError
    with pytest.raises(DecodeError, match="mlx5_0/1 read more than once"):
        net(TS0, port(), port())
