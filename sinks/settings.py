"""Settings of the sink process."""

from __future__ import annotations

from pydantic import Field

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
    sink_serve_queries: bool = Field(default=True, description="answer SQL on query_port (embedded store)")
