"""Settings of the sink process."""

from __future__ import annotations

import ipaddress

from pydantic import Field, ValidationInfo, field_validator

from core.settings import CommonSettings


class SinkSettings(CommonSettings):
    """FLEETPULSE_SINK_* tune batching, waiting and the sink's endpoint; the rest is shared with every process."""

    sink_group_id: str = Field(default="fleetpulse-sink", min_length=1, description="the sink's consumer group")
    sink_batch_max_rows: int = Field(default=50_000, ge=1, le=1_000_000, description="rows per insert at most")
    sink_batch_max_seconds: float = Field(default=1.0, gt=0, le=60, description="longest wait to fill a batch of an "
                                                                                 "event stream (XIDs, faults, drains)")
    sink_periodic_batch_max_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="longest wait to fill a batch of a periodic stream (samples, NCCL, agent status, ports, scores: "
                    "every host every interval): longer waits make fewer, larger inserts, which cost a store of its "
                    "own less CPU but come in bursts that a pipeline sharing its cores with the store feels")
    sink_fetch_max_records: int = Field(default=5_000, ge=1, description="records per fetch from the broker")
    sink_tables: list[str] | None = Field(default=None, description="tables to feed; default all")
    sink_wait_max_s: float = Field(
        default=5.0, ge=0.2, le=300, description="longest pause between two tries while the store is away, busy, "
                                                 "over its quota or out of parts (0.2 s doubling up to this)")
    sink_max_partitions_per_insert: int = Field(
        default=1000, ge=1, description="day partitions one insert may touch (ClickHouse's default 100 stopped a batch "
                                        "of XIDs spanning months); a batch over it is inserted in parts")
    sink_json_intake: bool = Field(
        default=True, description="gpu_samples' rows extracted by ClickHouse from each checked record's JSON "
                                  "(schemas/json_intake.py) rather than by Python: the same values, 2-3x the rows/s")
    sink_apply_schema: bool = Field(
        default=True, description="make and migrate the tables at start-up as the schema owner; false: only check "
                                  "them (the owner applies DDL with `fleetpulse migrate`), for a sink that holds "
                                  "the writer's credentials alone")
    sink_http: bool = Field(default=True, description="serve /status, /metrics (and /query on an embedded store) on "
                                                      "sink_port")
    sink_host: str = Field(default="127.0.0.1", description="address the sink's endpoint listens on; any but "
                                                            "loopback needs FLEETPULSE_SINK_TOKEN")

    @field_validator("sink_host")
    @classmethod
    def _token_off_loopback(cls, value: str, info: ValidationInfo) -> str:
        loopback = value == "localhost"
        try:
            loopback = loopback or ipaddress.ip_address(value).is_loopback
        except ValueError:
            pass
        if not loopback and info.data.get("sink_token") is None:
            raise ValueError("an address other than loopback needs FLEETPULSE_SINK_TOKEN (the endpoint answers SQL)")
        return value
