"""The fault-bin stage: XID/SXid events, host samples, network port samples and host kernel-log events (all
co-partitioned by host) -> binned, deduplicated faults."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.codec import encode
from schemas.topics import FAULTS, HOST_EVENTS, NET, SAMPLES, XID
from streams.fault_bins.config import FaultBinConfig
from streams.fault_bins.host_state import HostState
from streams.fault_bins.rules import evaluate
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step, stage_logger

HOSTS = "hosts"
log = stage_logger("fault_bins")


def step(records: Sequence[Record], state: State, cfg: FaultBinConfig) -> list[Emit]:
    """One host's XIDs and samples meet its state (GPU counter memory, fault history, open dedup windows)."""
    prior = {h: state.get(HOSTS, h) or HostState() for h in {r.value["host"] for r in records}}
    result = evaluate([(r.kind, r.value) for r in records], prior, cfg, owned=True)
    for host, st in prior.items():  # all kept in memory; to the changelog when a rule-read value changed
        state.put(HOSTS, host, st, durable=host in result.state)
    if result.stats["replayed"]:  # after a restart: records the state had already applied
        log.info("skipped %d replayed records", result.stats["replayed"])
    return [Emit(FAULTS, f.host.encode(), encode(f), f"fault {f.evidence.get('emission')} {f.host} gpu={f.gpu_index} "
                 f"{f.code} -> {f.bin} ({f.rule}) count={f.count}") for f in result.faults]


SETTING = Setting("fault_bins", FaultBinConfig, "fault-bin rule parameters")
STAGE = StageSpec(
    name="fault_bins",
    description="XID/SXid lines, GPU counters, network ports and host kernel lines -> bin, escalation, deduplicated "
                "fault events",
    steps=(Step("telemetry", (Input(XID, "xid"), Input(SAMPLES, "sample"), Input(NET, "net"),
                                Input(HOST_EVENTS, "host_event")), step,
                batch_within_s=lambda cfg: cfg.batch_within_s),),
    outputs=(FAULTS,),
    tables=(StateTable(HOSTS, "per-host GPU counter memory, fault history and open dedup windows (keyed by host)",
                  live=HostState),),
    config=SETTING.of,
    settings=(SETTING,),
)
