"""InfinibandCollector against sysfs trees under tests/data/sysfs_infiniband, every field of every port.

The trees are written by hand in the kernel's formats, not captured from a host. Formats: Linux
drivers/infiniband/core/sysfs.c (state_show "%d: %s" with NOP/DOWN/INIT/ARMED/ACTIVE/ACTIVE_DEFER, phys_state_show
"%u: %s" with Sleep/Polling/Disabled/PortConfigurationTraining/LinkUp/LinkErrorRecovery/Phy Test, rate_show
"%d%s Gb/sec (%dX%s)" where %s is ".5" for half rates, link_layer_show InfiniBand/Ethernet/Unknown, the PMA counters
"%u" / "%llu", gid_attrs/ndevs/<i> failing with EINVAL where the GID has no netdev, as IB GIDs do) and
Documentation/ABI/stable/sysfs-class-infiniband. The RoCE rate "200 Gb/sec (4X HDR)" is how mlx5 reports 200GAUI-4
Ethernet (drivers/infiniband/hw/mlx5/main.c, translate_eth_ext_proto_oper). A down IB port showing
"10 Gb/sec (4X SDR)" is what hosts commonly show (ibstat "Rate: 10"); the kernel prints whatever the HCA reports.

Git keeps no symlinks here, so each test copies a tree into tmp_path and links <device>/device to a PCI directory
under pci/ (which holds the IPoIB / Ethernet interfaces in net/<if>/dev_port), as sysfs does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agents.infiniband import InfinibandCollector, read_ports
from schemas.network import COUNTERS, ERROR_COUNTERS, NetSample
from schemas.topics import NET

DATA = Path(__file__).resolve().parents[1] / "data" / "sysfs_infiniband"
DGX_PCI = {"mlx5_0": "0000:18:00.0", "mlx5_1": "0000:40:00.0", "mlx5_2": "0000:4f:00.0", "mlx5_3": "0000:5e:00.0",
           "mlx5_4": "0000:9a:00.0", "mlx5_5": "0000:c0:00.0", "mlx5_6": "0000:ce:00.0", "mlx5_7": "0000:dc:00.0",
           "mlx5_8": "0000:29:00.0", "mlx5_9": "0000:29:00.1"}


def tree(tmp_path: Path, case: str, pci: dict[str, str]) -> str:
    """The recorded tree `case`, copied, with each device's `device` link made; returns the infiniband root."""
    base = tmp_path / case
    shutil.copytree(DATA / case, base)
    for device, address in pci.items():
        (base / "pci" / address).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.join("..", "..", "pci", address), base / "infiniband" / device / "device")
    return str(base / "infiniband")


def collector(root: str, **kw) -> InfinibandCollector:
    times = iter(range(1_760_000_000, 1_760_001_000, 10))
    return InfinibandCollector(root, host="dgx-a17", rack="r12", cluster="c1", clock=lambda: float(next(times)), **kw)


def checked(sample: NetSample) -> NetSample:
    """Every sample must pass the topic's validator and survive a strict round trip."""
    NET.check(sample.model_dump())
    assert NetSample.model_validate_json(sample.model_dump_json(), strict=True) == sample
    return sample


def port_dict(sample: NetSample, device: str) -> dict:
    (port,) = [p for p in sample.ports if p.device == device]
    return port.model_dump()


def test_dgx_h100_ports(tmp_path):
    sample = checked(collector(tree(tmp_path, "dgx_h100_ndr", DGX_PCI)).sample())
    assert (sample.host, sample.rack, sample.cluster, sample.job) == ("dgx-a17", "r12", "c1", None)
    assert (sample.ts, sample.seq, sample.source) == (1_760_000_000.0, 0, "sysfs")
    got = [(p.device, p.port, p.pci_bus_id, p.netdev, p.link_layer, p.state, p.phys_state, p.rate_gbps, p.rate)
           for p in sample.ports]
    ndr, hdr = "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"
    assert got == [
        ("mlx5_0", 1, "0000:18:00.0", "ibp24s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_1", 1, "0000:40:00.0", "ibp64s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_2", 1, "0000:4f:00.0", "ibp79s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_3", 1, "0000:5e:00.0", "ibp94s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_4", 1, "0000:9a:00.0", "ibp154s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_5", 1, "0000:c0:00.0", "ibp192s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),  # not its .8001 child
        ("mlx5_6", 1, "0000:ce:00.0", "ibp206s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_7", 1, "0000:dc:00.0", "ibp220s0", "InfiniBand", "ACTIVE", "LinkUp", 400.0, ndr),
        ("mlx5_8", 1, "0000:29:00.0", "enp41s0f0np0", "Ethernet", "ACTIVE", "LinkUp", 200.0, hdr),  # gid_attrs
        ("mlx5_9", 1, "0000:29:00.1", "enp41s0f1np1", "Ethernet", "ACTIVE", "LinkUp", 200.0, hdr),  # device/net
    ]
    traffic = [(p.port_xmit_data, p.port_rcv_data, p.port_xmit_packets, p.port_rcv_packets, p.port_xmit_wait)
               for p in sample.ports]
    assert traffic == [
        (2183927448113152, 2181004931772416, 2140712390881, 2138551009113, 41277902118),
        (2183935367226703, 2181011044779837, 2140713394298, 2138552007314, 41281214045),
        (2183943286340254, 2181017157787258, 2140714397715, 2138553005515, 41284525972),
        (2183951205453805, 2181023270794679, 2140715401132, 2138554003716, 41287837899),
        (2183959124567356, 2181029383802100, 2140716404549, 2138555001917, 41291149826),
        (2183967043680907, 2181035496809521, 2140717407966, 2138556000118, 41294461753),
        (2183974962794458, 2181041609816942, 2140718411383, 2138556998319, 41297773680),
        (2183982881908009, 2181047722824363, 2140719414800, 2138557996520, 41301085607),
        (48113900217344, 97400118562048, 51774300112, 104812009977, 0),
        (48113900218461, 97400118564279, 51774300113, 104812009978, 0),
    ]
    errors = {p.device: {c: getattr(p, c) for c in ERROR_COUNTERS if getattr(p, c) != 0} for p in sample.ports}
    assert errors == {f"mlx5_{i}": {} for i in range(10)} | {
        "mlx5_3": {"symbol_error": 3, "link_error_recovery": 1, "link_downed": 1, "port_rcv_errors": 2}}


def test_link_down_and_degraded(tmp_path):
    pci = {"mlx5_0": "0000:1a:00.0", "mlx5_1": "0000:3c:00.0", "mlx5_2": "0000:4d:00.0"}
    ports = read_ports(tree(tmp_path, "link_down", pci))
    zero = dict.fromkeys(ERROR_COUNTERS, 0)
    identity = {"port": 1, "netdev": None, "link_layer": "InfiniBand"}
    assert [p.model_dump() for p in ports] == [
        {**identity, **zero, "device": "mlx5_0", "pci_bus_id": "0000:1a:00.0", "state": "DOWN",
         "phys_state": "Disabled", "rate_gbps": 10.0, "rate": "10 Gb/sec (4X SDR)", "link_downed": 7,
         "link_error_recovery": 255, "symbol_error": 65535, "port_xmit_data": 913551207424,
         "port_rcv_data": 911004210688, "port_xmit_packets": 893112977, "port_rcv_packets": 890620114,
         "port_xmit_wait": 7730112},
        {**identity, **zero, "device": "mlx5_1", "pci_bus_id": "0000:3c:00.0", "state": "DOWN",
         "phys_state": "Polling", "rate_gbps": 10.0, "rate": "10 Gb/sec (4X SDR)", "link_downed": 1,
         "port_xmit_data": 0, "port_rcv_data": 0, "port_xmit_packets": 0, "port_rcv_packets": 0, "port_xmit_wait": 0},
        {**identity, **zero, "device": "mlx5_2", "pci_bus_id": "0000:4d:00.0", "state": "ACTIVE",
         "phys_state": "LinkUp", "rate_gbps": 200.0, "rate": "200 Gb/sec (2X NDR)", "symbol_error": 1482,
         "link_error_recovery": 12, "link_downed": 4, "port_rcv_errors": 96, "local_link_integrity_errors": 3,
         "port_xmit_data": 301118420992512, "port_rcv_data": 300877102448640, "port_xmit_packets": 294201337110,
         "port_rcv_packets": 293880419502, "port_xmit_wait": 18337120554},
    ]


def test_partial_port_reads_none_and_keeps_the_good_port(tmp_path):
    sample = checked(collector(tree(tmp_path, "partial", {})).sample())
    bad, good = (p.model_dump() for p in sample.ports)
    assert bad == {
        "device": "mlx5_0", "port": 1, "pci_bus_id": None, "netdev": None,
        "link_layer": None,  # missing
        "state": None,  # "ACTIVE" without its number is not what state_show writes
        "phys_state": "LinkUp", "rate_gbps": None, "rate": None,  # "unknown"
        **dict.fromkeys(ERROR_COUNTERS, 0),
        "symbol_error": None,  # "N/A"
        "port_rcv_errors": None,  # "-1"
        "link_downed": None,  # "12 34"
        "VL15_dropped": None, "port_xmit_constraint_errors": None, "port_xmit_wait": None,  # missing
        "port_xmit_data": None,  # 2**63: past what the topic's validator takes
        "port_rcv_data": None,  # "0x1f"
        "port_xmit_packets": 77,
        "port_rcv_packets": None,  # empty
    }
    assert good == {"device": "mlx5_1", "port": 1, "pci_bus_id": None, "netdev": None, "link_layer": "InfiniBand",
                    "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 100.0, "rate": "100 Gb/sec (4X EDR)",
                    **dict.fromkeys(ERROR_COUNTERS, 0), "port_xmit_data": 5, "port_rcv_data": 6,
                    "port_xmit_packets": 7, "port_rcv_packets": 8, "port_xmit_wait": 2**63 - 1}


@pytest.mark.parametrize("text, gbps", [
    ("2.5 Gb/sec (1X SDR)", 2.5), ("10 Gb/sec (4X)", 10.0), ("12.5 Gb/sec (1X FDR)", 12.5),
    ("100 Gb/sec (2X HDR)", 100.0), ("56 Gb/sec (4X FDR)", 56.0), ("800 Gb/sec (8X NDR)", 800.0),
    ("25 Gb/sec (1X EDR)", 25.0), ("Gb/sec", None), ("400Gb/sec", None), ("", None), ("999999 Gb/sec (4X)", None),
])
def test_rate_text(tmp_path, text, gbps):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "rate").write_text(text + "\n")
    (reading,) = read_ports(str(tmp_path))
    assert (reading.rate_gbps, reading.rate) == ((gbps, text) if gbps is not None else (None, None))


@pytest.mark.parametrize("state, phys, want", [
    ("5: ACTIVE_DEFER", "6: LinkErrorRecovery", ("ACTIVE_DEFER", "LinkErrorRecovery")),
    ("2: INIT", "7: Phy Test", ("INIT", "Phy Test")),
    ("3: ARMED", "4: PortConfigurationTraining", ("ARMED", "PortConfigurationTraining")),
    ("9: UNKNOWN", "0: <unknown>", ("UNKNOWN", "<unknown>")),
    ("4:", "LinkUp", (None, None)),
    ("4: " + "A" * 200, "\xff\xfe", (None, None)),
])
def test_state_text(tmp_path, state, phys, want):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_bytes(phys.encode("latin-1") + b"\n")
    (reading,) = read_ports(str(tmp_path))
    assert (reading.state, reading.phys_state) == want


def test_unreadable_files_read_as_none(tmp_path):
    """A file whose read fails (EINVAL from a counter the driver lacks; here a directory, EISDIR) is None."""
    port = tmp_path / "mlx5_0" / "ports" / "1"
    for name in ("state", "counters/symbol_error", "gid_attrs/ndevs/0"):
        (port / name).mkdir(parents=True)
    (port / "counters" / "link_downed").write_text("2\n")
    (reading,) = read_ports(str(tmp_path))
    assert (reading.state, reading.symbol_error, reading.netdev, reading.link_downed) == (None, None, None, 2)


def test_netdev_by_dev_port_and_pci_checks(tmp_path):
    """A two-port device's ports take the interfaces whose dev_port is port - 1; a parent that is not a PCI address
    (a virtual device) gives no pci_bus_id."""
    for n in (1, 2):
        (tmp_path / "ib" / "mlx4_0" / "ports" / str(n)).mkdir(parents=True)
    pci = tmp_path / "pci" / "0000:81:00.0"
    for name, dev_port in (("ibp129s0", "0"), ("ibp129s0d1", "1")):
        (pci / "net" / name).mkdir(parents=True)
        (pci / "net" / name / "dev_port").write_text(dev_port + "\n")
    os.symlink(pci, tmp_path / "ib" / "mlx4_0" / "device")
    (tmp_path / "ib" / "rxe0" / "ports" / "1").mkdir(parents=True)
    (tmp_path / "virtual" / "net" / "eth0").mkdir(parents=True)  # one interface, no dev_port: taken as the port's
    (tmp_path / "virtual" / "net" / "eth1").mkdir(parents=True)
    os.symlink(tmp_path / "virtual", tmp_path / "ib" / "rxe0" / "device")
    os.symlink(tmp_path / "nowhere", tmp_path / "ib" / "mlx4_0" / "ports" / "1" / "dangling")
    got = [(p.device, p.port, p.pci_bus_id, p.netdev) for p in read_ports(str(tmp_path / "ib"))]
    assert got == [("mlx4_0", 1, "0000:81:00.0", "ibp129s0"), ("mlx4_0", 2, "0000:81:00.0", "ibp129s0d1"),
                   ("rxe0", 1, None, None)]
    shutil.rmtree(tmp_path / "virtual" / "net" / "eth1")
    assert read_ports(str(tmp_path / "ib"))[2].netdev == "eth0"


def test_seq_and_ts_advance(tmp_path):
    c = collector(tree(tmp_path, "partial", {}), job="llm-70b")
    samples = [checked(c.sample()) for _ in range(3)]
    assert [(s.seq, s.ts, s.job) for s in samples] == [(0, 1_760_000_000.0, "llm-70b"), (1, 1_760_000_010.0, "llm-70b"),
                                                        (2, 1_760_000_020.0, "llm-70b")]
    c.close()


def test_supported_on_a_recorded_host(tmp_path):
    c = collector(tree(tmp_path, "link_down", {}))
    assert c.name == "infiniband"
    assert c.is_supported() and c.unsupported_reason is None


@pytest.mark.parametrize("make, reason", [
    (lambda root: None, "no RDMA devices under {root} (no InfiniBand/RoCE NIC, or the mlx5_ib / ib_core modules "
                        "are not loaded)"),
    (lambda root: root.mkdir(), "no RDMA devices under {root} (no InfiniBand/RoCE NIC, or the mlx5_ib / ib_core "
                                "modules are not loaded)"),
    (lambda root: (root / "mlx5_0").mkdir(parents=True), "no RDMA device under {root} has a ports/ directory (mlx5_0)"),
])
def test_unsupported_says_why(tmp_path, make, reason):
    root = tmp_path / "infiniband"
    make(root)
    c = collector(str(root))
    assert not c.is_supported()
    assert c.unsupported_reason == reason.format(root=root)
    assert checked(c.sample()).ports == []


def test_device_without_ports_is_skipped(tmp_path):
    """A device unbinding between the listing and the read leaves a directory without ports/; the others stay."""
    root = tree(tmp_path, "partial", {})
    os.mkdir(os.path.join(root, "mlx5_00"))
    shutil.rmtree(os.path.join(root, "mlx5_0", "ports", "1"))
    for odd in ("not-a-port", "\u00b2", "256"):
        os.mkdir(os.path.join(root, "mlx5_0", "ports", odd))
    c = collector(root)
    assert c.is_supported()
    assert [(p.device, p.port) for p in checked(c.sample()).ports] == [("mlx5_1", 1)]


def test_counters_cover_the_schema():
    """The recorded DGX tree has every counter file the schema names, so a rename in one shows up here."""
    names = sorted(os.listdir(DATA / "dgx_h100_ndr" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"))
    assert names == sorted(COUNTERS)
