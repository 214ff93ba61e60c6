"""A GPU's links as the rules see them: a PCIe link trained below what its slot allows, NVLink links gone inactive,
and a fabric (NVLink domain) that failed to train or lost its Fabric Manager. None of these raises an Xid: a link that
trains down at boot or a Fabric Manager that dies leaves the GPU answering NVML as usual (NVSentinel issues 889 and
890, gpud issue 1085). Each is an episode of the GPU, reported once when it has lasted its time and forgotten when it
clears or the GPU is reset (GpuMemo.rebooted)."""

from __future__ import annotations

from operator import itemgetter
from typing import Callable

from schemas.analytics import FaultBin
from schemas.telemetry import FABRIC_FAILURE, FABRIC_STATUS, FABRIC_SUCCESS
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import Finding, GpuMemo

# Parts of NVML's fabric health mask that say the fabric is broken (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*):
# (what, shift, width mask, values that are a fault). Degraded bandwidth and recoveries under way are not, alone.
HEALTH_FAULTS = (
    ("routes unhealthy", 4, 0x3, frozenset({1})),
    ("incorrect configuration", 8, 0xF, frozenset(range(2, 9))),
    ("Fabric Manager disconnected", 14, 0x3, frozenset({2})),
)
UNTRAINED = frozenset({1, 2})  # not started, in progress
EPISODES = ("pcie", "nvlink", "fabric")  # this module's keys in GpuMemo.ep
_LINK_FIELDS = ("pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max", "nvlink_links",
                "nvlink_active_mask", "fabric_status", "fabric_health_mask")
_LINKS = itemgetter(*_LINK_FIELDS)


def quiet(g: dict, memo: GpuMemo) -> bool:
    """True when link_findings could neither find nor remember anything in this reading: every link at what its slot
    allows, every NVLink link active and already counted, the fabric trained and known to be, no episode open. Most
    readings of most GPUs: the rules skip them (the fault-bin step's hot path)."""
    if memo.ep:
        return False
    try:
        width, wmax, gen, gmax, links, mask, status, health = _LINKS(g)
    except KeyError:  # a reading that leaves optional fields out
        width, wmax, gen, gmax, links, mask, status, health = (g.get(f) for f in _LINK_FIELDS)
    return (width == wmax and gen == gmax and not health
            and (mask is None or not links or (mask.bit_count() == links and memo.links == links))
            and (status != FABRIC_SUCCESS or memo.fabric_ok) and status not in UNTRAINED and status != FABRIC_FAILURE)


def health_faults(mask: int | None) -> list[str]:
    """The broken parts a fabric health mask names, e.g. ['Fabric Manager disconnected']."""
    if not mask:
        return []
    return [what for what, shift, width, bad in HEALTH_FAULTS if (mask >> shift) & width in bad]


def _lasting(memo: GpuMemo, code: str, bad: bool, ts: float, after_s: float) -> list | None:
    """The GPU's episode `code` ([since, samples, told]): ended when not `bad`; returned the one time it has lasted
    `after_s` (from the first sample that showed it), else None."""
    ep = memo.ep.get(code)
    if not bad:
        if ep is not None:
            del memo.ep[code]
        return None
    if ep is None:
        ep = memo.ep[code] = [ts, 0, False]
    ep[1] += 1
    if ep[2] or ts - ep[0] < after_s:
        return None
    ep[2] = True
    return ep


def _finding(key: str, g: dict, code: str, bin_: FaultBin, action: str, reason: str, ep: list, **evidence) -> Finding:
    ev = {"pci": str(g.get("pci_bus_id")), "since": f"{ep[0]:.3f}", "samples": str(ep[1]),
          **{k: str(v) for k, v in evidence.items()}}
    return Finding(key, code, bin_.value, code, action, 1, [reason], ev, g["index"], g.get("uuid"))


def domain_of(g: dict, rack: str, config: FaultBinConfig) -> str | None:
    """The GPU's NVLink domain: its fabric cluster and clique ('<cluster uuid>/<clique>'), else its rack where racks
    are domains (config.nvlink_domain 'rack': 'rack:<rack>'), else None."""
    cluster = g.get("fabric_cluster_uuid")
    if cluster:
        return f"{cluster}/{g.get('fabric_clique_id')}"
    return f"rack:{rack}" if config.nvlink_domain == "rack" and rack else None


def link_findings(key: str, g: dict, memo: GpuMemo, ts: float, host: str, config: FaultBinConfig,
                  peers: Callable[[int], int], rack: str = "") -> tuple[list[Finding], bool]:
    """(findings, whether the GPU's link memory changed) for one reading. `peers(links)`: the most NVLink links active
    on another GPU of the host that has `links` links, in this sample. NVLink and fabric findings name the GPU's
    NVLink domain (`domain`, domain_of) when it has one."""
    out: list[Finding] = []
    before = (sum(k in memo.ep for k in EPISODES), memo.links, memo.fabric_ok)
    where, after = f"{host} GPU {key}", config.gpu_link_degraded_s
    domain = {"domain": d} if (d := domain_of(g, rack, config)) else {}
    # PCIe: fewer lanes than the slot allows is never power saving; a lower generation is, on an idle GPU
    width, wmax, gen, gmax = (g.get("pcie_link_width"), g.get("pcie_link_width_max"), g.get("pcie_link_gen"),
                              g.get("pcie_link_gen_max"))
    narrow = width is not None and bool(wmax) and width < wmax
    busy = (g.get("gpu_util_pct") or 0.0) >= config.pcie_busy_util_pct
    slow = gen is not None and bool(gmax) and gen < gmax and busy
    if (narrow or slow or "pcie" in memo.ep) and (ep := _lasting(memo, "pcie", narrow or slow, ts, after)):
        what = " and ".join([*([f"x{width} of x{wmax}"] if narrow else []),
                             *([f"Gen{gen} of Gen{gmax} while {g.get('gpu_util_pct'):g} % busy"] if slow else [])])
        out.append(_finding(key, g, "pcie_downtrained", FaultBin.INSPECT, "CHECK_MECHANICALS",
                            f"{where}: PCIe link at {what} since {ep[0]:.3f} ({ep[1]} samples): it trained down "
                            f"(riser, slot or card edge); copies between host and GPU run slower", ep, width=width,
                            width_max=wmax, gen=gen, gen_max=gmax, util_pct=g.get("gpu_util_pct")))
    # NVLink: against the most links this GPU had active since it started, and its host's other GPUs now
    links, mask = g.get("nvlink_links"), g.get("nvlink_active_mask")
    if links and mask is not None:
        active = mask.bit_count()
        memo.links = max(memo.links, active)
        expected = max(memo.links, peers(links)) if active < links else active
        down = active < expected
        if (down or "nvlink" in memo.ep) and (ep := _lasting(memo, "nvlink", down, ts, after)):
            idle = [i for i in range(links) if not mask >> i & 1]
            out.append(_finding(
                key, g, "nvlink_down", FaultBin.RESET, "RESET_GPU",
                f"{where}: {active} of {links} NVLink links active since {ep[0]:.3f} ({ep[1]} samples), where "
                f"{expected} were (this GPU had {memo.links}, its host's other GPUs have {peers(links)}); inactive: "
                f"{','.join(map(str, idle))}: collectives over them fail or fall back to slower paths; a GPU reset "
                f"trains the links again, a link that stays down after it goes to a person", ep, links=links,
                active=active, expected=expected, active_mask=hex(mask), **domain))
    # Fabric: a failed training or a health mask naming a fault at once; a trained fabric lost for a while
    status, health = g.get("fabric_status"), g.get("fabric_health_mask")
    if status == FABRIC_SUCCESS:
        memo.fabric_ok = True
    broken = health_faults(health)
    failed = status == FABRIC_FAILURE or bool(broken)
    lost = memo.fabric_ok and status in UNTRAINED
    if (failed or lost or "fabric" in memo.ep) and \
            (ep := _lasting(memo, "fabric", failed or lost, ts, 0.0 if failed else after)):
        what = "; ".join([f"fabric status {FABRIC_STATUS.get(status, status)}", *broken])
        out.append(_finding(
            key, g, "fabric_failed", FaultBin.REBOOT, "RESET_FABRIC",
            f"{where}: {what} since {ep[0]:.3f} ({ep[1]} samples){', after it was trained' if lost else ''}: the GPU "
            f"cannot use its NVLink domain and new CUDA jobs fail to start; restart the Fabric Manager or reset the "
            f"fabric (a reboot does both)", ep, fabric_status=status, health_mask=hex(health or 0),
            clique_id=g.get("fabric_clique_id"), cluster_uuid=g.get("fabric_cluster_uuid"), **domain))
    ongoing = sum(k in memo.ep for k in EPISODES)  # an episode counts its samples: written each one
    return out, (ongoing, memo.links, memo.fabric_ok) != before or ongoing > 0
