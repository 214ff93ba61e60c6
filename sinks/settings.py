"""Settings of the sink process."""

from __future__ import annotations

import ipaddress

from pydantic import Field, ValidationInfo, field_validator

from core.settings import CommonSettings


class SinkSettings(CommonSettings):
    """FLEETPULSE_SINK_* tune batching; the rest is shared with every process."""

    sink_group_id: str = Field(default="fleetpulse-sink", min_length=1)
    sink_batch_max_rows: int = Field(default=50_000, ge=1, le=1_000_000)
    sink_batch_max_seconds: float = Field(default=1.0, gt=0, le=60)
    sink_fetch_max_records: int = Field(default=5_000, ge=1)
    sink_tables: list[str] | None = Field(default=None, description="tables to feed; default all")
    sink_insert_retries: int = Field(default=8, ge=0)
    sink_max_partitions_per_insert: int = Field(
        default=1000, ge=1, description="day partitions one insert may touch (ClickHouse's default 100 stopped a batch "
                                        "of XIDs spanning months); a batch over it is inserted in parts")
    sink_json_intake: bool = Field(
        default=True, description="gpu_samples' rows extracted by ClickHouse from each checked record's JSON "
                                  "(schemas/json_intake.py) rather than by Python: the same values, 2-3x the rows/s")
    sink_serve_queries: bool = Field(default=True, description="answer SQL on query_port (embedded store)")
    # The query endpoint (sinks/query_guard.py): read-only statements within these limits.
    query_host: str = Field(default="127.0.0.1", description="address the query endpoint listens on; any but "
                                                              "loopback needs FLEETPULSE_QUERY_TOKEN")
    query_max_rows: int = Field(default=1_000_000, ge=1, description="rows one answer may hold")
    query_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description="bytes one answer may hold")
    query_max_seconds: float = Field(default=30.0, gt=0, le=3600, description="longest query an analyst may run")
    query_max_memory_mb: int = Field(default=2048, ge=16, description="memory one query may use")

    @field_validator("query_host")
    @classmethod
    def _token_off_loopback(cls, value: str, info: ValidationInfo) -> str:
        loopback = value == "localhost"
        try:
            loopback = loopback or ipaddress.ip_address(value).is_loopback
        except ValueError:
            pass
        if not loopback and info.data.get("query_token") is None:
            raise ValueError("an address other than loopback needs FLEETPULSE_QUERY_TOKEN (the endpoint answers SQL)")
        return value
