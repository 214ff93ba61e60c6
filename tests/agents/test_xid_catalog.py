"""The packaged XID catalog and the first bin it gives every XID, workflow bucket and SXid."""

from __future__ import annotations

import csv

import pytest

from schemas.analytics import FaultBin
from schemas.xid_catalog import catalog, first_bin, lookup, recovery_bin

# Independent restatement of the mapping the module documents: catalog immediate action -> bin.
PLAIN = {"IGNORE": "ignore", "RESTART_APP": "retry", "CHECK_UVM": "retry", "RESET_GPU": "reset",
         "WORKFLOW_XID_48": "reset", "WORKFLOW_NVLINK_ERR": "reset", "RESTART_BM": "reboot", "RESTART_VM": "reboot",
         "CONTACT_SUPPORT": "inspect", "CHECK_MECHANICALS": "inspect", "UPDATE_SWFW": "inspect"}


def test_packaged_catalog_is_the_reference_csv_verbatim(reference_dir):
    from importlib import resources

    packaged = resources.files("schemas").joinpath("data/xid_catalog.csv").read_bytes()
    assert packaged == (reference_dir / "xid_catalog.csv").read_bytes()


def test_catalog_rows_load_with_typed_fields(reference_dir):
    with open(reference_dir / "xid_catalog.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(catalog()) == len(rows) == 168
    e79 = lookup(79)
    assert (e79.mnemonic, e79.immediate_action, e79.investigatory_action) == (
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT")
    assert e79.applies == {"A100": True, "H100": True, "B100": True, "GB200": True}
    assert lookup(121).applies == {"A100": False, "H100": False, "B100": False, "GB200": True}
    assert lookup(126).applies["B100"] is None  # blank cell, not a guess
    assert lookup(45).description.startswith("Preemptive cleanup, due to previous errors")  # quoted comma kept
    assert lookup(107) is None and lookup(0) is None and lookup(100000) is None
    assert catalog() is catalog()


def test_every_plain_catalog_action_maps_to_its_documented_bin():
    seen = set()
    for code, entry in catalog().items():
        if entry.immediate_action in PLAIN:
            assert first_bin(code) == (FaultBin(PLAIN[entry.immediate_action]), entry.immediate_action), code
            seen.add(entry.immediate_action)
    assert seen == set(PLAIN)


@pytest.mark.parametrize("code, kwargs, expected", [
    (45, {}, ("ignore", "WORKFLOW_XID_45")),                        # solo: the other Xid carries the bin
    (45, {"caused_by": 79}, ("reboot", "WORKFLOW_XID_45")),         # follows the named Xid
    (45, {"caused_by": 13}, ("retry", "WORKFLOW_XID_45")),
    (45, {"caused_by": 45}, ("ignore", "WORKFLOW_XID_45")),
    (145, {"severity": "Nonfatal"}, ("ignore", "WORKFLOW_NVLINK5_ERR")),
    (149, {"severity": "Fatal"}, ("reset", "WORKFLOW_NVLINK5_ERR")),
    (146, {}, ("reset", "WORKFLOW_NVLINK5_ERR")),
    (154, {"recovery_action": 0}, ("ignore", "XID_154")),
    (154, {"recovery_action": 1}, ("reset", "XID_154")),
    (154, {"recovery_action": 2}, ("reboot", "XID_154")),
    (154, {"recovery_action": 4}, ("reset", "XID_154")),
    (154, {}, ("inspect", "XID_154")),
    (159, {}, ("retry", "CHECK_UVM")),
    (48, {}, ("reset", "WORKFLOW_XID_48")),
    (74, {}, ("reset", "WORKFLOW_NVLINK_ERR")),
    (171, {}, ("reset", "")),            # DRAM detail of an Xid 48: 48's bin
    (163, {}, ("inspect", "FREE_TEXT")),
    (167, {}, ("inspect", "")),
    (61, {}, ("inspect", "CONTACT_SUPPORT")),   # unused on Ampere+
    (107, {}, ("inspect", "UNKNOWN")),          # not in the catalog copy
    (4242, {}, ("inspect", "UNKNOWN")),
])
def test_workflow_buckets_blank_and_unknown_codes(code, kwargs, expected):
    bin_, action = first_bin(code, **kwargs)
    assert (bin_.value, action) == expected


@pytest.mark.parametrize("code, severity, expected", [
    (10004, None, ("inspect", "CHECK_THERMALS")),
    (10005, "Non-fatal", ("ignore", "IGNORE")),
    (10006, "Fatal", ("reset", "RESET_FABRIC")),
    (12028, "Non-fatal", ("reset", "RESET_FABRIC")),   # the table wins over the line's own word
    (18005, "Fatal", ("inspect", "INVESTIGATE_LINK_SI")),
    (20034, "Fatal", ("reset", "SXID_FATAL")),
    (22013, "Non-fatal", ("ignore", "SXID_NONFATAL")),
    (28006, None, ("inspect", "UNKNOWN")),
])
def test_sxid_bins(code, severity, expected):
    bin_, action = first_bin(code, "sxid", severity=severity)
    assert (bin_.value, action) == expected


def test_recovery_actions_cover_nvml_enum_and_unknown_values_go_to_a_person():
    assert [recovery_bin(a).value for a in range(8)] == [
        "ignore", "reset", "reboot", "reset", "reset", "inspect", "reset", "reboot"]
    assert recovery_bin(99) is FaultBin.INSPECT


def test_simulator_expected_bins_agree_with_the_catalog():
    from agents.simulator.xid import EXPECTED_BIN

    for code, expected in EXPECTED_BIN.items():
        assert first_bin(code)[0].value == expected, code
