"""A toy stage, to show what adding one takes: this package and one entry-point line (tests/streams/test_toy_stage.py).

It fires `ToyHotGpu` once when a GPU reaches `hot_c`, and its rules raise on the records of `refuse_host` (so the
runtime's dead letters can be seen for a stage that does nothing about them)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from schemas.analytics import Alert, fingerprint
from schemas.codec import encode
from schemas.topics import ALERTS, SAMPLES
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step

HOT = "hot"


class ToyConfig(BaseModel):
    """FLEETPULSE_TOY='{"hot_c": 80}'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hot_c: float = 90.0
    refuse_host: str = ""


def step(records: Sequence[Record], state: State, cfg: ToyConfig) -> list[Emit]:
    out = []
    for rec in records:
        host = rec.value["host"]
        if host == cfg.refuse_host:
            raise ValueError(f"toy refuses {host}")
        hot = set(state.get(HOT, host, []))
        for g in rec.value["gpus"]:
            temp = g.get("gpu_temp_c")
            if temp is None or temp < cfg.hot_c or g["index"] in hot:
                continue
            hot.add(g["index"])
            a = Alert(fingerprint=fingerprint("ToyHotGpu", host=host, gpu_index=g["index"]), status="firing",
                      alertname="ToyHotGpu", ts=rec.value["ts"], starts_at=rec.value["ts"], host=host,
                      gpu_index=g["index"], value=temp, threshold=cfg.hot_c, summary=f"GPU at {temp} C",
                      evidence={"gpu_temp_c": temp})
            out.append(Emit(ALERTS, host.encode(), encode(a), f"ToyHotGpu {host} gpu={g['index']} {temp} C"))
        state.put(HOT, host, sorted(hot))
    return out


SETTING = Setting("toy", ToyConfig, "the toy stage's threshold")
STAGE = StageSpec(
    name="toy",
    description="hot GPUs -> one alert each",
    steps=(Step("telemetry", (Input(SAMPLES, "sample"),), step),),
    outputs=(ALERTS,),
    tables=(StateTable(HOT, "each host's GPUs already reported hot"),),
    config=SETTING.of,
    settings=(SETTING,),
)
