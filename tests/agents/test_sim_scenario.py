"""Scenario files: the shipped ones load, and every malformed file fails with the offending field named."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.simulator import FleetSimulator, xid
from agents.simulator.cli import configure_parser, run
from agents.simulator.fleet import HGX_PCI_BUSES
from agents.simulator.scenario import RunPlan, available, load_scenario
from core.errors import ConfigError
from tests.agents.test_sim_faults import XID_RE


def scenario(*faults: dict) -> dict:
    return {"name": "t", "faults": list(faults)}


def test_shipped_scenarios_are_listed_and_valid():
    assert {"baseline", "thermal-runaway", "straggler", "fault-mix"} <= set(available())
    runaway = load_scenario("thermal-runaway")
    (fault,) = runaway.faults
    assert (fault.kind, fault.at, fault.duration, fault.peak_c) == ("thermal_runaway", 30, 60, 91)


@pytest.mark.parametrize("fault, field", [
    ({"kind": "thermal_runaway", "at": 1, "host": 0, "peek_c": 90}, "faults.0.thermal_runaway.peek_c"),
    ({"kind": "thermal_runaway", "at": 1, "host": 0, "peak_c": 95}, "faults.0.thermal_runaway.peak_c"),
    ({"kind": "power_cap", "at": -1, "host": 0}, "faults.0.power_cap.at"),
    ({"kind": "slow_rank", "at": 1, "job": 0, "rank": 1}, "faults.0.slow_rank.slowdown_pct"),
    ({"kind": "xid", "at": 1, "host": 0}, "faults.0.xid.code"),
    ({"kind": "meltdown", "at": 1, "host": 0}, "faults.0"),
    ({"at": 1, "host": 0}, "faults.0"),
    ({"kind": "ecc_dbe", "at": 1, "host": 0, "gpu": 8}, "faults.0.ecc_dbe.gpu"),
])
def test_schema_errors_name_the_field(fault, field):
    with pytest.raises(ConfigError) as err:
        load_scenario(scenario(fault))
    assert f"{field}:" in str(err.value)


@pytest.mark.parametrize("fault, message", [
    ({"kind": "gpu_lost", "at": 1}, "exactly one target"),
    ({"kind": "gpu_lost", "at": 1, "host": 0, "job": 0, "rank": 0}, "exactly one target"),
    ({"kind": "slow_rank", "at": 1, "job": 0, "slowdown_pct": 5}, "rank is required with job"),
    ({"kind": "gpu_lost", "at": 1, "job": 0, "rank": 0, "gpu": 1}, "gpu goes with host"),
])
def test_target_rules(fault, message):
    with pytest.raises(ConfigError, match=message):
        load_scenario(scenario(fault))


@pytest.mark.parametrize("fault, message", [
    ({"kind": "gpu_lost", "at": 1, "host": 4}, "faults.0.host: index 4 outside the fleet's 4 hosts"),
    ({"kind": "gpu_lost", "at": 1, "host": "gpu-node-9999"}, "faults.0.host: no host named 'gpu-node-9999'"),
    ({"kind": "slow_rank", "at": 1, "job": 3, "rank": 0, "slowdown_pct": 5}, "faults.0.job: no job 3"),
    ({"kind": "slow_rank", "at": 1, "job": "job-0000", "rank": 32, "slowdown_pct": 5},
     "faults.0.rank: 32 >= world size 32"),
])
def test_targets_are_checked_against_the_fleet(fault, message):
    with pytest.raises(ConfigError, match=message):
        FleetSimulator(4, scenario=scenario(fault))


def test_slow_rank_on_an_idle_host_is_refused():
    with pytest.raises(ConfigError, match="faults.0.host: gpu-node-0039 runs no job"):
        FleetSimulator(40, scenario=scenario({"kind": "slow_rank", "at": 1, "host": 39, "gpu": 0, "slowdown_pct": 5}))


def test_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n "faults": [}')
    with pytest.raises(ConfigError, match=r"bad.json is not JSON: line 2 column 13"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="shipped: .*thermal-runaway"):
        load_scenario("no-such-scenario")
    good = tmp_path / "ok.json"
    good.write_text(json.dumps(scenario({"kind": "pcie_replay", "at": 2, "host": 0, "gpu": 1})))
    assert load_scenario(good).faults[0].rate_per_s == 5.0
    with pytest.raises(ConfigError, match=r"<root>|name"):
        load_scenario({"faults": []})


@settings(max_examples=200, deadline=None)
@given(code=st.integers(1, 65535), index=st.integers(0, 7), seed=st.integers(0, 2**32 - 1),
       caused_by=st.none() | st.integers(1, 200))
def test_any_xid_line_parses_back_to_its_fields(code, index, seed, caused_by):
    rng = np.random.default_rng(seed)
    event = xid.xid_event(ts=1_700_000_000.5, host="gpu-node-0001", rack="rack-000", cluster="sim", gpu_index=index,
                          gpu_uuid="GPU-x", pci_bus_id=f"0000:{xid_bus(index)}:00.0", code=code,
                          message=xid.message_for(code, rng), caused_by=caused_by)
    m = XID_RE.search(event["raw_line"])
    assert m and int(m.group(3)) == code and m.group(1) == f"0000:{xid_bus(index)}:00"
    assert m.group(4) == event["message"]
    if event["pid"] is not None:
        assert f"pid={event['pid']}," in event["raw_line"]


def xid_bus(index: int) -> str:
    return f"{HGX_PCI_BUSES[index]:02x}"


def test_cli_flags_default_to_none_and_fall_back_to_the_scenario_then_the_defaults(capsys):
    args = configure_parser(argparse.ArgumentParser()).parse_args(["--hosts", "3", "--speed", "0"])
    assert (args.hosts, args.duration, args.seed, args.scenario) == (3, None, None, None)
    assert (args.speed, args.interval, args.nccl_interval) == (0, None, None)
    assert load_scenario(None).plan(hosts=args.hosts) == RunPlan(3, 60.0, 1.0, 1.0, 0)
    straggler = load_scenario("straggler")
    assert straggler.plan() == RunPlan(128, 420.0, 5.0, 2.0, 0)
    assert straggler.plan(hosts=130, interval_s=1.0, seed=4) == RunPlan(130, 420.0, 1.0, 2.0, 4)  # flags win
    bad = configure_parser(argparse.ArgumentParser()).parse_args(["--hosts", "0"])
    assert run(bad) == 2
    assert "--hosts >= 1" in capsys.readouterr().err
    too_small = configure_parser(argparse.ArgumentParser()).parse_args(["--scenario", "straggler", "--hosts", "4"])
    assert run(too_small) == 1
    assert "fleet.jobs: jobs of [128] hosts do not fit a fleet of 4 hosts" in capsys.readouterr().err
