"""NVLink domain incidents (streams/lifecycle/domains.py): the trays of one domain losing their fabric or links together
are one incident of the domain through the lifecycle's own fleet step, not one breaker count and one page per tray;
the fault-bin stage names the domain from the GPUs' fabric or from the rack."""

from __future__ import annotations

import orjson

from schemas.topics import ALERTS, LIFECYCLE_DECISIONS, LIFECYCLE_FLEET
from streams import registry
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.gpu_links import domain_of
from streams.runtime.offline import offline_steps
from streams.runtime.spec import Record
from streams.settings import streams_settings

T0 = 50_000.0
TRAYS = [f"tray-{i:02d}" for i in range(18)]


class FleetStep:
    """The lifecycle's fleet step offline, over a fleet of `nodes` 8-GPU nodes (the breaker's cap: 5 % of them, at
    least 3)."""

    def __init__(self, nodes: int = 100):
        [self.step] = [s for s in offline_steps([registry.STAGES["lifecycle"]], streams_settings(None))
                       if s.step.run.__name__ == "fleet_step"]
        self.offset, self.decisions, self.pages = 0, [], []
        self.feed([{"kind": "share", "host": f"n{i:03d}", "ts": T0, "share": [8, 8, 0, 0, 0, 0, 0, 0, 0]}
                   for i in range(nodes - len(TRAYS))]
                  + [{"kind": "share", "host": h, "ts": T0, "share": [8, 8, 0, 0, 0, 0, 0, 0, 0]} for h in TRAYS])

    def feed(self, records: list[dict]) -> None:
        for rec in records:
            self.offset += 1
            for e in self.step.run([Record("fleet", rec, rec.get("host", "fleet"), LIFECYCLE_FLEET.name, 0,
                                           self.offset, 0)]):
                value = orjson.loads(e.value)
                if e.to is LIFECYCLE_DECISIONS:
                    self.decisions.append(value)
                elif e.to is ALERTS:
                    self.pages.append(value)


def proposal(host: str, ts: float, domain: str | None, code: str = "fabric_failed", n: int = 1) -> dict:
    evidence = {"code": code, "fault_id": f"{host}-{n}", **({"fault.domain": domain} if domain else {})}
    return {"kind": "drain", "proposal_id": f"{host}:1:p{n}", "host": host, "ts": ts, "repair": "reboot",
            "mode": "immediate", "reason": f"fault {code} -> reboot (gpu_link)", "evidence": evidence}


def test_a_domain_whose_18_trays_lose_their_fabric_is_one_incident_one_page_and_one_breaker_count():
    f = FleetStep()
    f.feed([proposal(h, T0 + 10 + 0.1 * k, "c1/7") for k, h in enumerate(TRAYS)])
    assert [d["admitted"] for d in f.decisions] == [True] * 18  # a cap of 5 drains: 18 trays would trip it
    assert {d["incident"] for d in f.decisions[1:]} == {"c1/7"} and "incident" not in f.decisions[0]
    assert f.decisions[-1]["incident_hosts"] == "18" and "not counted again by the breaker" in f.decisions[-1]["reason"]
    [page] = f.pages
    assert (page["alertname"], page["status"], page["severity"], page["labels"]["domain"]) == (
        "NvlinkDomainDown", "firing", "page", "c1/7")
    assert page["value"] == 2.0 and "its NVSwitch trays, its Fabric Manager" in page["summary"]
    f.feed([proposal("n000", T0 + 20, None, code="xid:79"), proposal("n001", T0 + 21, None, code="xid:79")])
    assert [d["admitted"] for d in f.decisions[18:]] == [True, True]  # the domain counted once: room for others
    f.feed([{"kind": "back", "host": h, "ts": T0 + 4000 + k} for k, h in enumerate(TRAYS)])
    assert [(p["status"], p["value"]) for p in f.pages] == [("firing", 2.0), ("resolved", 18.0)]
    assert f.pages[1]["ts"] == T0 + 4017  # the last tray back ends it


def test_trays_of_different_domains_or_far_apart_in_time_are_no_incident():
    f = FleetStep()
    f.feed([proposal("tray-00", T0, "c1/1"), proposal("tray-01", T0 + 1, "c1/2"),  # HGX boards: one domain each
            proposal("tray-02", T0 + 2, "c1/3"), proposal("tray-03", T0 + 700, "c1/3")])  # past domain_window_s
    assert f.pages == [] and all("incident" not in d for d in f.decisions)
    assert [d["admitted"] for d in f.decisions] == [True] * 4


def test_a_replayed_proposal_is_answered_once_and_a_tray_denied_by_an_open_breaker_opens_no_incident():
    f = FleetStep(nodes=40)  # cap 3
    f.feed([proposal(h, T0 + k, None, code="xid:79") for k, h in enumerate(("n000", "n001", "n002"))])
    f.feed([proposal("tray-00", T0 + 10, "c1/7"), proposal("tray-01", T0 + 11, "c1/7")])
    assert [d["admitted"] for d in f.decisions] == [True, True, True, False, False]
    assert [p["alertname"] for p in f.pages] == ["FleetDrainBreakerOpen"]
    f.feed([proposal("tray-00", T0 + 10, "c1/7")])  # a restart before the offset commit
    assert len(f.decisions) == 5


def test_the_fault_bin_stage_names_the_domain_from_the_fabric_or_the_rack():
    fabric = {"fabric_cluster_uuid": "6f3c0a1e-0000-4000-8000-000000000001", "fabric_clique_id": 7}
    assert domain_of(fabric, "rack-01", FaultBinConfig()) == "6f3c0a1e-0000-4000-8000-000000000001/7"
    assert domain_of({"fabric_cluster_uuid": None}, "rack-01", FaultBinConfig()) is None  # NVML reported none
    racks = FaultBinConfig(nvlink_domain="rack")
    assert domain_of({}, "rack-01", racks) == "rack:rack-01" and domain_of(fabric, "rack-01", racks).endswith("/7")
