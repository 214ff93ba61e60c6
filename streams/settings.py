"""Settings of the stream worker process: which stages run, batching, and each stage's rule parameters."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from pydantic import create_model

from core.settings import CommonSettings
from schemas.topics import SAMPLES
from streams.registry import STAGES


class WorkerSettings(CommonSettings):
    """The worker's own settings (FLEETPULSE_STAGES, FLEETPULSE_STREAMS_*), under the stages' (StreamsSettings)."""

    stages: Annotated[list[str] | None, NoDecode] = Field(
        default=None, description="comma-separated stage names (streams/registry.py); default all")
    streams_batch_max: int = Field(default=500, ge=1, le=100_000, description="records per stage batch at most")
    streams_batch_within_s: float = Field(default=1.0, gt=0, le=60, description="longest wait to fill a batch")
    streams_commit_interval_s: float = Field(default=2.8, gt=0, le=60, description="how often offsets commit "
                                             "(faust's default; lag seen from outside is this stale)")
    streams_web_port: int | None = Field(default=None, ge=1024, le=65535, description="faust web; unset = off")
    streams_metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Prometheus /metrics of the "
                                             "worker's stages (e.g. 9465); unset = off, 0 = any free port")
    streams_metrics_addr: str = Field(default="0.0.0.0", description="address the worker's /metrics listens on")
    streams_session_timeout_s: float = Field(default=15.0, ge=6, le=300, description="how soon the consumer group "
                                             "drops a worker that died without leaving, so its restart (or another "
                                             "worker) takes its partitions over; above any batch's processing time")
    streams_recovery_stall_s: float = Field(default=180.0, ge=5, le=3600, description="a table recovery that has "
                                            "records left and has received none for this long stops the worker "
                                            "(exit 1) so its restart recovers afresh (streams/faust_adapter/recovery.py); "
                                            "above faust's 90 s broker request timeout, which each of recovery's "
                                            "offset reads may take")
    streams_recovery_reread_s: float = Field(default=30.0, ge=1, le=3600, description="a table recovery that has "
                                             "records left and has received none for this long reads its stuck "
                                             "changelog partitions again from the record after the last applied "
                                             "one, once per stall, at most 3 times per recovery, before the stall "
                                             "limit stops the worker (streams/faust_adapter/recovery.py ReRead; at or "
                                             "above FLEETPULSE_STREAMS_RECOVERY_STALL_S: never)")
    streams_changelog_segment_s: float = Field(default=600.0, ge=1, le=7 * 86_400, description="a table changelog's "
                                               "segment closes after this long, so the broker's log cleaner can "
                                               "compact it: a restarted worker restores one record per key and at "
                                               "most this much history beside it, not all that was written since "
                                               "the segment opened (Kafka's own limits: 7 days or 1 GiB)")
    streams_telemetry_processes: int | None = Field(
        default=None, ge=1, le=64, description="telemetry worker processes `fleetpulse streams` runs in the one "
        "consumer group, a share of the partitions each (not with --worker; a process's stages run on one core); "
        "unset or auto: one per core this process may run on, at most the samples topic's partitions")
    streams_gc_young: int = Field(default=50_000, ge=0, description="allocations between the cyclic garbage "
                                  "collector's young collections (Python's 700 makes it walk the stages' state "
                                  "thousands of times a second: 2-3x the CPU per sample); 0 keeps Python's")
    streams_eager_delivery: bool = Field(default=True, description="hand each fetched record to the stages in the "
                                         "fetch loop's own task, falling back to faust's four tasks per record only "
                                         "when the hand-over has to wait (streams/faust_adapter/delivery.py): ~30 % less "
                                         "CPU; false: faust's own fetch loop")
    streams_direct_lanes: bool = Field(default=True, description="lanes take their records from the fetch loop in "
                                       "batches (streams/runtime/inbox.py), not one faust event at a time through "
                                       "a stream; needs streams_eager_delivery. false: through faust's streams")

    @field_validator("stages", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()] or None
        return value

    @field_validator("streams_telemetry_processes", mode="before")
    @classmethod
    def _auto(cls, value):
        if isinstance(value, str):
            if value.strip().lower() in ("", "auto"):
                return None
            if not value.strip().isdigit():
                raise ValueError("a number of processes (1 to 64), or auto")
        return value


# Each stage's rule parameters, one JSON object each (FLEETPULSE_LIFECYCLE='{"min_dwell_s": 300}'), are the settings
# its StageSpec declares (streams/runtime/spec.py Setting): a stage added to the registry brings its own. Unset = the
# defaults documented on each model; unknown keys fail at start-up with the key named.
_OWNED = [setting for spec in STAGES.values() for setting in spec.settings]
_TAKEN = sorted({s.name for s in _OWNED if s.name in WorkerSettings.model_fields or
                 sum(o.name == s.name for o in _OWNED) > 1})
if _TAKEN:
    raise TypeError(f"stage setting name(s) {', '.join(_TAKEN)} declared twice, or taken by the worker's own settings")
StreamsSettings = create_model(
    "StreamsSettings", __base__=WorkerSettings, __module__=__name__,
    __doc__="FLEETPULSE_STAGES, FLEETPULSE_STREAMS_*, FLEETPULSE_RACK_* and each stage's rule parameters; the rest is "
            "shared with every process.",
    **{s.name: (s.model, Field(default_factory=s.model, description=s.help)) for s in _OWNED})


def streams_settings(settings: CommonSettings | None = None, **overrides) -> StreamsSettings:
    """StreamsSettings from the environment, keeping the shared fields of `settings` when one is given."""
    from core.settings import load

    base = settings.model_dump(include=set(CommonSettings.model_fields)) if settings is not None else {}
    if isinstance(settings, StreamsSettings):
        base = settings.model_dump()
    return load(StreamsSettings, **{**base, **overrides})


def telemetry_processes(settings: StreamsSettings) -> int:
    """The telemetry processes to run: as set, or (auto) one per core this process may run on (its CPU affinity, as
    a container's cpuset gives it), capped by the samples topic's partitions: a process with none would idle."""
    if settings.streams_telemetry_processes is not None:
        return settings.streams_telemetry_processes
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, SAMPLES.partitions))
