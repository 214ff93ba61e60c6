"""NVLink domain incidents: trays of one NVLink domain (a GB200 NVL72 rack, named by the fault-bin stage from the GPUs'
fabric cluster and clique, or from the rack where racks are domains) whose link or fabric faults come together are one
incident of the domain's shared part (its NVSwitch trays, its Fabric Manager), not one per tray.

The fleet step decides the first trays' drains as any other (a drain never waits); once `domain_min_hosts` trays of
one domain were admitted within `domain_window_s`, the domain's incident opens: one NvlinkDomainDown page naming the
domain and its trays, the breaker's window keeps one entry for the incident (its first tray's), and every later tray of
the domain with such a fault is admitted under the incident without the breaker (one incident, one count: a whole
domain failing must not trip the breaker and hold back every other drain of the fleet). Each drain request carries the
incident (`incident`, `incident_hosts`). The incident ends, and its page resolves, when every tray of it has been
validated back into service.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from schemas.analytics import Alert, fingerprint

ALERTNAME = "NvlinkDomainDown"
# The fault-bin stage's codes whose evidence names a domain (streams/fault_bins/gpu_links.py): a domain's trays losing
# NVLink links, or their fabric, at once is the domain's.
DOMAIN_CODES = frozenset({"nvlink_down", "fabric_failed"})
NAMES_MAX = 40  # hosts named in the page's labels; the count is always whole


def domain_of(proposal: Mapping) -> str | None:
    """The NVLink domain a drain proposal's fault names, when its fault is one a domain can have."""
    evidence = proposal.get("evidence") or {}
    return evidence.get("fault.domain") or None if evidence.get("code") in DOMAIN_CODES else None


@dataclass
class Incident:
    """A domain's trays admitted for link or fabric faults since `since` (the state value `domain:<domain>`)."""

    domain: str
    since: float
    hosts: list[str] = field(default_factory=list)  # admitted, in order
    codes: list[str] = field(default_factory=list)
    open: bool = False  # domain_min_hosts reached: paged, later trays join without the breaker
    back: list[str] = field(default_factory=list)  # trays validated back into service since

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping | None) -> Incident | None:
        return cls(**raw) if raw else None

    def add(self, host: str, code: str) -> None:
        if host not in self.hosts:
            self.hosts.append(host)
        if code not in self.codes:
            self.codes.append(code)
        if host in self.back:
            self.back.remove(host)

    def page(self, status: str, ts: float, min_hosts: int, window_s: float) -> Alert:
        names = sorted(self.hosts)
        listed = ",".join(names[:NAMES_MAX]) + (f",... ({len(names)})" if len(names) > NAMES_MAX else "")
        n = len(self.hosts)
        summary = (f"{n} trays of NVLink domain {self.domain} lost NVLink links or their fabric since "
                   f"{self.since:.0f} ({', '.join(sorted(self.codes))}): the domain's shared part (its NVSwitch "
                   f"trays, its Fabric Manager), not each tray; one incident: its trays drain under it and count once "
                   f"against the breaker" if status == "firing"
                   else f"NVLink domain {self.domain}: all {n} trays of the incident since {self.since:.0f} validated "
                        f"back into service")
        return Alert(fingerprint=fingerprint(f"{ALERTNAME}|domain={self.domain}"), status=status, alertname=ALERTNAME,
                     severity="page", ts=ts, starts_at=self.since, ends_at=ts if status == "resolved" else None,
                     value=float(n), threshold=float(min_hosts), summary=summary[:1000],
                     labels={"stage": "lifecycle", "domain": self.domain, "hosts": listed,
                             "codes": ",".join(sorted(self.codes))},
                     evidence={"trays": float(n), "back": float(len(self.back)), "window_s": window_s})
