"""Parameters of the fault-bin rules (windows, escalation limits, counter rates), each with its default's reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DAY_S = 86_400.0


class FaultBinConfig(BaseModel):
    """Every knob of streams.fault_bins; the stage's Setting `fault_bins` (stage.py) exposes it as one
    JSON variable (FLEETPULSE_FAULT_BINS='{"repeat_n": 2}'), and the stage uses these defaults until then."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Storm dedup: one FaultEvent per (GPU, code, bin) per window. The first occurrence goes out at once (the drain
    # path waits on it); later ones fold into a summary when the window closes. 5 min covers the bursts seen in
    # practice (an Xid 13/31 storm of a crashing job, Xid 74/119 bursts) and matches a 5-min health-check cadence.
    dedup_window_s: float = Field(default=300.0, gt=0, le=DAY_S)
    # History: the same fatal fault (first bin reset or reboot) N times on one GPU within the window -> replace.
    repeat_n: int = Field(default=3, ge=2, le=100)
    repeat_window_s: float = Field(default=DAY_S, gt=0)
    # Xid 48 / a new DBE: the reset that follows remaps the row, so a second DBE on the same GPU within the window
    # means remapping does not contain it (the catalog's WORKFLOW_XID_48 ends in the RMA flow); a second flood of
    # corrected errors after the reset likewise.
    repeat_n_by_code: dict[str, int] = Field(default_factory=lambda: {"xid:48": 2, "ecc_dbe": 2, "ecc_sbe_flood": 2})
    # Lines of one incident (a burst of the same Xid within a minute) count as one repeat, not N.
    incident_gap_s: float = Field(default=60.0, ge=0)
    # A GPU that has a fatal fault again after K reboots that each followed a fatal fault -> replace. 2 lets a
    # reboot fix a transient once and a second time (Meta flags lemon nodes after 2-3 failures).
    reboots_k: int = Field(default=2, ge=1, le=100)
    reboots_window_s: float = Field(default=7 * DAY_S, gt=0)
    # A GPU missing from its host's sample is lost only after this many consecutive samples: one NVML read that
    # failed for one GPU on one sample is a blip, not a GPU off the bus (Xid 79 itself is binned at once).
    lost_after_samples: int = Field(default=2, ge=1, le=100)
    # Counter rates: more than rate x window within one window. DCGM's health watch fails PCIe at 8 replays/min
    # (dcgm_gpu_hardware_limits.h DCGM_LIMIT_MAX_PCIREPLAY_RATE: "the maximum recommended by RM").
    pcie_replay_per_min: float = Field(default=8.0, gt=0)
    pcie_replay_window_s: float = Field(default=60.0, gt=0)
    # DCGM fails NVLink CRC at 100/s; the sample carries the all-link total and a link erring at a tenth of that
    # is already worth a look (inspect), well above a healthy link's near-zero background.
    nvlink_crc_per_s: float = Field(default=10.0, gt=0)
    nvlink_crc_window_s: float = Field(default=10.0, gt=0)
    # Corrected (single-bit) ECC errors: a healthy HBM stack counts a handful a day; thousands a second is a memory
    # failing while DCGM still calls the GPU healthy (DCGM issue 313). fleetpulse's default: 10/s over a minute.
    ecc_sbe_per_s: float = Field(default=10.0, gt=0)
    ecc_sbe_window_s: float = Field(default=60.0, gt=0)
    # Corrected errors climbing (trends.py): the 30 min average rate at least trend_min_per_h, trend_growth times the
    # 6 h one and trend_sigma standard deviations above it -> suspect (drained once its job is done) [ours].
    trend_fast_s: float = Field(default=1800.0, gt=0, le=DAY_S)
    trend_slow_s: float = Field(default=21600.0, gt=0, le=30 * DAY_S)
    trend_min_per_h: float = Field(default=30.0, gt=0)
    trend_growth: float = Field(default=2.0, ge=1)
    trend_sigma: float = Field(default=4.0, ge=0)
    # A GPU's PCIe link below the lanes (always) or generation (while busy: an idle GPU may slow its link to save
    # power) its slot allows, or fewer NVLink links active than the GPU or its host's peers had, in every sample for
    # this long: degraded. A fabric that stops being trained for this long after it was is down.
    gpu_link_degraded_s: float = Field(default=60.0, ge=0, le=DAY_S)
    pcie_busy_util_pct: float = Field(default=50.0, ge=0, le=100)
    # The NVLink domain a GPU's link and fabric faults name (evidence `domain`), so the lifecycle sees one domain's
    # trays failing together as one incident: "fabric" the GPU's own fabric cluster UUID and clique id (NVML; an HGX
    # board is a domain of its own), none when it reports no cluster; "rack" a rack is one domain (GB200 NVL72 racks
    # whose collectors report no fabric: dcgm-exporter carries no cluster UUID), the fabric's when it reports one.
    nvlink_domain: Literal["fabric", "rack"] = "fabric"
    # NVLink recovery (link retrain) errors: DCGM treats any as critical (DCGM_LIMIT_MAX_NVLINK_ERROR 1).
    nvlink_recovery_max: int = Field(default=0, ge=0, description="recoveries tolerated per window")
    nvlink_recovery_window_s: float = Field(default=60.0, gt=0)
    # InfiniBand/RoCE ports (streams/fault_bins/host_rules.py). A port seen ACTIVE that has not been ACTIVE in any
    # sample for this long is down: a link that drops and retrains within it is a flap (which ib_link_flap counts).
    link_down_s: float = Field(default=60.0, ge=0, le=DAY_S)
    # A link that drops and retrains this many times within the window goes to a person; fewer are recorded (retry).
    # Each drop crashes the collectives over it, and a healthy link does not drop at all.
    flap_limit: int = Field(default=3, ge=1, le=100)
    flap_window_s: float = Field(default=3600.0, gt=0, le=DAY_S)
    # An ACTIVE port below the best rate it was seen at, in every sample for this long: degraded.
    degraded_s: float = Field(default=60.0, ge=0, le=DAY_S)
    # Physical-layer errors (symbol, link recovery, integrity, receive) above this rate over the window: inspect.
    # fleetpulse's default, not a vendor's: a clean HDR/NDR link counts none in an hour.
    phy_errors_per_min: float = Field(default=10.0, gt=0)
    phy_window_s: float = Field(default=300.0, gt=0, le=DAY_S)
    # A port not read for this long may have been through a reboot: it must be seen ACTIVE again before it counts.
    port_gap_s: float = Field(default=120.0, gt=0, le=DAY_S)
    # An XID older than the host's newest applied XID by more than this is a replay; within it, a digest decides.
    xid_replay_slack_s: float = Field(default=2.0, ge=0, le=3600)
    xid_digests_max: int = Field(default=256, ge=8, le=10_000)
    # A host's state is written to its changelog when something a rule reads changed (an Xid, a finding, an error
    # counter, a missing GPU), else at most this often: energy and SBE counters move on every healthy sample.
    state_flush_s: float = Field(default=30.0, ge=0, le=3600)
    # Evidence strings are cut here so per-host state stays small.
    evidence_chars: int = Field(default=240, ge=32, le=4096)
    # The stage's take(n, within): the XID -> fault event -> drain request budget is 2 s p95 end to end.
    batch_within_s: float = Field(default=0.05, gt=0, le=5.0)

    def repeat_limit(self, code: str) -> int:
        return self.repeat_n_by_code.get(code, self.repeat_n)


def rule_table(c: FaultBinConfig) -> list[tuple[str, str, str]]:
    """(rule, when it fires -> bin, parameters) for every rule a FaultEvent can name: for docs and the CLI."""
    rate = "more than {} in {:g} s (or that rate over a longer gap between samples)"
    return [
        ("catalog", "an XID whose catalog immediate action maps to a bin (schemas.xid_catalog.first_bin)", "-"),
        ("unknown_code", "an Xid the catalog does not list -> inspect", "-"),
        ("workflow_45", "Xid 45 -> the bin of the Xid named by 'caused by previous Xid N', else ignore", "-"),
        ("workflow_48", "Xid 48 (DBE) -> reset", "-"),
        ("workflow_nvlink", "Xid 74 -> reset; ignore when the line or its collector says non-fatal", "-"),
        ("workflow_nvlink5", "Xid 144-150 -> reset; ignore for a Nonfatal unit error", "-"),
        ("workflow_154", "Xid 154 -> the bin of the recovery action written in the line", "-"),
        ("sxid", "an NVSwitch SXid -> its Fabric Manager bucket, else by the line's severity", "-"),
        ("counter_dbe", "ecc_dbe: volatile or aggregate DBE count grew -> reset", "-"),
        ("counter_row_remap", "row_remap_pending turned on -> reset; row_remap_failure turned on -> replace", "-"),
        ("counter_pcie_replay", "pcie_replay: replays " + rate.format(
            f"{c.pcie_replay_per_min * c.pcie_replay_window_s / 60:g}", c.pcie_replay_window_s) + " -> inspect",
         f"pcie_replay_per_min={c.pcie_replay_per_min:g}, pcie_replay_window_s={c.pcie_replay_window_s:g}"),
        ("counter_nvlink_crc", "nvlink_crc: CRC errors " + rate.format(
            f"{c.nvlink_crc_per_s * c.nvlink_crc_window_s:g}", c.nvlink_crc_window_s) + " -> inspect",
         f"nvlink_crc_per_s={c.nvlink_crc_per_s:g}, nvlink_crc_window_s={c.nvlink_crc_window_s:g}"),
        ("counter_ecc_sbe_flood", "ecc_sbe_flood: corrected ECC errors " + rate.format(
            f"{c.ecc_sbe_per_s * c.ecc_sbe_window_s:g}", c.ecc_sbe_window_s) + " -> reset (repeat -> replace)",
         f"ecc_sbe_per_s={c.ecc_sbe_per_s:g}, ecc_sbe_window_s={c.ecc_sbe_window_s:g}"),
        ("trend_ecc", "ecc_trend: corrected ECC errors climbing (the short average rate over the long one, Poisson "
         "significant) -> inspect, drained once the node's job is done (mode after_jobs), told once until a reset",
         f"trend_fast_s={c.trend_fast_s:g}, trend_slow_s={c.trend_slow_s:g}, trend_min_per_h={c.trend_min_per_h:g}, "
         f"trend_growth={c.trend_growth:g}, trend_sigma={c.trend_sigma:g}"),
        ("pcie_downtrained", "a GPU's PCIe link below its maximum width (or generation while the GPU is busy) in "
         "every sample for a while -> inspect",
         f"gpu_link_degraded_s={c.gpu_link_degraded_s:g}, pcie_busy_util_pct={c.pcie_busy_util_pct:g}"),
        ("nvlink_down", "fewer NVLink links active than the GPU had, or than its host's other GPUs have, for a while "
         "-> reset (repeat -> replace)", f"gpu_link_degraded_s={c.gpu_link_degraded_s:g}"),
        ("fabric_failed", "the GPU's fabric training failed, its health mask names a fault or the Fabric Manager "
         "disconnected, or a trained fabric stays untrained for a while -> reboot (restart the Fabric Manager)",
         f"gpu_link_degraded_s={c.gpu_link_degraded_s:g}"),
        ("counter_nvlink_recovery", "nvlink_recovery: recovery errors " + rate.format(
            c.nvlink_recovery_max, c.nvlink_recovery_window_s) + " -> reset",
         f"nvlink_recovery_max={c.nvlink_recovery_max}, nvlink_recovery_window_s={c.nvlink_recovery_window_s:g}"),
        ("gpu_lost", "a GPU seen before is missing from consecutive host samples -> reboot",
         f"lost_after_samples={c.lost_after_samples}"),
        ("ib_link_down", "an InfiniBand/RoCE port seen ACTIVE has not been ACTIVE in any sample for a while -> inspect",
         f"link_down_s={c.link_down_s:g}, port_gap_s={c.port_gap_s:g}"),
        ("ib_link_flap", "a port's link_downed counter grew (retry); flap_limit times within the window -> inspect",
         f"flap_limit={c.flap_limit}, flap_window_s={c.flap_window_s:g}"),
        ("ib_rate_degraded", "an ACTIVE port below the best rate it ran at, in every sample for a while -> inspect",
         f"degraded_s={c.degraded_s:g}"),
        ("ib_phy_errors", f"a port's physical-layer error counters rose more than "
         f"{c.phy_errors_per_min * c.phy_window_s / 60:g} within any {c.phy_window_s:g} s -> inspect",
         f"phy_errors_per_min={c.phy_errors_per_min:g}, phy_window_s={c.phy_window_s:g}"),
        ("host_event", "a kernel-log line about the NIC, disks, filesystems, CPUs or memory -> the bin of its code "
         "(streams/fault_bins/host_rules.py HOST_EVENT_BINS)", "-"),
        ("escalation_repeat", "the same reset/reboot fault on one GPU N times in the window -> replace",
         (f"repeat_n={c.repeat_n}, repeat_n_by_code={c.repeat_n_by_code}, repeat_window_s={c.repeat_window_s:g}, "
          f"incident_gap_s={c.incident_gap_s:g}")),
        ("escalation_reboots", "a reset/reboot fault on a GPU after K reboots that each followed one -> replace",
         f"reboots_k={c.reboots_k}, reboots_window_s={c.reboots_window_s:g}"),
    ]


