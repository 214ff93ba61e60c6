"""The power/thermal stage: host samples -> per-GPU alerts and each host's power, re-keyed by rack -> rack alerts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from core.errors import DecodeError
from schemas.analytics import Alert
from schemas.codec import encode
from schemas.topics import ALERTS, RACK_POWER, SAMPLES
from streams.power_thermal.racks import RackConfig, RackState, evaluate_racks
from streams.power_thermal.rules import GpuRuleConfig, RackReport, SubjectState, evaluate
from streams.runtime.spec import Emit, Input, Record, StageSpec, StateTable, State, Step

HOSTS, RACKS = "hosts", "racks"


@dataclass(frozen=True)
class PowerThermalConfig:
    hosts: GpuRuleConfig
    racks: RackConfig


def config(settings) -> PowerThermalConfig:
    """Rack budgets from FLEETPULSE_RACK_BUDGETS_W / _RACK_INVENTORY_FILE; none means no rack power reports."""
    budgets = settings.rack_budgets()
    return PowerThermalConfig(GpuRuleConfig(rack_budgets_w=budgets), RackConfig(budgets_w=budgets))


def check_report(value) -> RackReport:
    """A forwarded rack power report (the stage's own internal record)."""
    try:
        return RackReport(**value)
    except TypeError as exc:
        raise DecodeError(f"bad rack power report: {exc}") from None


def alert(a: Alert) -> Emit:
    return Emit(ALERTS, (a.host or a.rack).encode(), encode(a),
                f"{a.status} {a.alertname} {a.host or a.rack} gpu={a.gpu_index} value={a.value:.1f} "
                f"threshold={a.threshold:.1f}")


def step(records: Sequence[Record], state: State, cfg: PowerThermalConfig) -> list[Emit]:
    """Samples through the per-GPU rules (host state by host), rack reports through the rack rules (by rack)."""
    out: list[Emit] = []
    samples = [r.value for r in records if r.kind == "sample"]
    if samples:
        prior = {h: SubjectState.from_json(state.get(HOSTS, h)) for h in {s["host"] for s in samples}}
        result = evaluate(samples, prior, cfg.hosts)
        for host, st in result.state.items():
            state.put(HOSTS, host, st.to_json())
        out += [Emit(RACK_POWER, rep.rack.encode(), orjson.dumps(dataclasses.asdict(rep)))
                for rep in result.rack_reports]
        out += [alert(a) for a in result.alerts]
    reports = [r.value for r in records if r.kind == "rack_report"]
    if reports:
        prior = {rack: RackState.from_json(state.get(RACKS, rack)) for rack in {rep.rack for rep in reports}}
        alerts, changed = evaluate_racks(reports, prior, cfg.racks)
        for rack, st in changed.items():
            state.put(RACKS, rack, st.to_json())
        out += [alert(a) for a in alerts]
    return out


STAGE = StageSpec(
    name="power_thermal",
    description="per-GPU limits, throttle bits and rack budgets -> fire/resolve alerts",
    steps=(Step("telemetry", (Input(SAMPLES, "sample"), Input(RACK_POWER, "rack_report", check_report)), step),),
    outputs=(ALERTS, RACK_POWER),
    tables=(StateTable(HOSTS, "per-host GPU alert state (keyed by host, like the samples)"),
            StateTable(RACKS, "per-rack host power and rack alert state (keyed by rack)")),
    config=config,
)
