"""Settings of the host agent process: FLEETPULSE_AGENT_* variables over an optional TOML or JSON config file."""

from __future__ import annotations

import json
import socket
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource

from core.errors import ConfigError
from core.settings import CommonSettings, load

# Stable collector names (agents/registry.py): config values, metric labels and log fields.
COLLECTOR_NAMES = ("nvml", "nvml_xid", "dcgm", "kernel_log", "nccl_inspector", "infiniband")
DEFAULT_COLLECTORS = ["nvml", "nvml_xid", "kernel_log", "nccl_inspector", "infiniband"]
_FILE_VALUES: ContextVar[dict[str, Any] | None] = ContextVar("agent_config_file_values", default=None)


class AgentSettings(CommonSettings):
    """Labels, collectors and their cadence, the metrics port and the spool; the rest is shared with every process."""

    agent_host: str = Field(default_factory=socket.gethostname, min_length=1, description="host label")
    agent_rack: str = Field(default="", description="this host's rack (records carry it; rack budgets use it)")
    agent_cluster: str = Field(default="", description="this host's cluster name, carried by every record")
    agent_job: str | None = Field(default=None, description="job label on samples (e.g. from the scheduler)")
    agent_collectors: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_COLLECTORS), description=f"comma-separated, of {COLLECTOR_NAMES}")
    agent_interval_s: float = Field(default=10.0, gt=0, le=3600, description="seconds between samples")
    agent_event_poll_s: float = Field(default=0.5, gt=0, le=60, description="XID/NCCL sources: longest wait")
    agent_recheck_s: float = Field(default=300.0, ge=0, description="re-probe unsupported collectors; 0 = never")
    agent_poll_stall_s: float = Field(default=30.0, gt=0, le=3600,
                                      description="a poll running this long is stalled: the agent's status says so "
                                                  "and names the call it hangs in (a GPU or driver in trouble)")
    agent_status_every_s: float = Field(default=60.0, gt=0, le=3600,
                                        description="seconds between agent status records while nothing changes")
    agent_metrics_port: int | None = Field(default=9464, ge=0, le=65535, description="empty or off: none")
    agent_metrics_addr: str = Field(default="0.0.0.0", description="address the agent's /metrics listens on")
    agent_dcgm_url: str = Field(default="http://localhost:9400/metrics",
                                description="dcgm-exporter's /metrics (the dcgm source)")
    agent_kernel_log: str = Field(default="auto", description="auto, kmsg, journald, or a log file path")
    agent_nccl_dump_dir: Path | None = Field(default=None, description="NCCL Inspector dump directory")
    agent_infiniband_root: Path = Field(default=Path("/sys/class/infiniband"),
                                        description="where the infiniband collector reads RDMA ports (sysfs)")
    agent_spool_dir: Path | None = Field(default=None, description="default: <data_dir>/spool")
    agent_spool_max_bytes: int = Field(default=256 << 20, ge=1 << 16,
                                       description="the spool of records the broker has not acknowledged, at most")
    agent_spool_fsync: Literal["always", "interval", "never"] = Field(
        default="interval", description="when the spool is flushed to disk: always, interval or never")
    agent_spool_fsync_interval_s: float = Field(default=1.0, gt=0, description="seconds between flushes (interval)")
    agent_stall_after_s: float = Field(default=5.0, gt=0, description="unacknowledged this long = broker away")
    agent_shutdown_timeout_s: float = Field(default=10.0, ge=0, description="delivery attempts at shutdown")

    @field_validator("agent_collectors", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            value = [s.strip() for s in value.split(",") if s.strip()]
        return value

    @field_validator("agent_collectors")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(COLLECTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown collectors {unknown}; known: {', '.join(COLLECTOR_NAMES)}")
        if not value:
            raise ValueError("name at least one collector")
        return list(dict.fromkeys(value))

    @field_validator("agent_metrics_port", mode="before")
    @classmethod
    def _off(cls, value):
        return None if isinstance(value, str) and value.strip().lower() in ("", "off", "none") else value

    @field_validator("agent_kernel_log")
    @classmethod
    def _kernel_log(cls, value: str) -> str:
        if value not in ("auto", "kmsg", "journald") and not Path(value).is_absolute():
            raise ValueError("must be auto, kmsg, journald or an absolute file path")
        return value

    @property
    def spool_dir(self) -> Path:
        return (self.agent_spool_dir or self.data_dir / "spool").resolve()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings, env_settings,
                                   dotenv_settings, file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        """Priority: explicit arguments, then the environment, then the config file, then defaults."""
        return init_settings, env_settings, dotenv_settings, _ConfigFileSource(settings_cls), file_secret_settings


class _ConfigFileSource(PydanticBaseSettingsSource):
    """The values of the file given to `load_agent_settings`, keyed by field name."""

    def get_field_value(self, field, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        out = {}
        for name, value in (_FILE_VALUES.get() or {}).items():
            alias = getattr(self.settings_cls.model_fields[name].validation_alias, "choices", None)
            out[str(alias[0]) if alias else name] = value  # aliased fields validate under their alias only
        return out


def read_config_file(path: Path) -> dict[str, Any]:
    """A flat TOML (.toml) or JSON table of settings, keyed by field name (`agent_host`) or variable name."""
    try:
        raw = path.read_bytes()
        data = json.loads(raw) if path.suffix.lower() == ".json" else tomllib.loads(raw.decode())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ConfigError(f"config file {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") \
            from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of settings, got {type(data).__name__}")
    values = {}
    for key, value in data.items():
        name = key.lower().removeprefix("fleetpulse_")
        if name not in AgentSettings.model_fields:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        values[name] = value
    return values


def load_agent_settings(config_file: str | Path | None = None, **overrides) -> AgentSettings:
    """AgentSettings from overrides, FLEETPULSE_* variables and the config file, in that order of precedence."""
    token = _FILE_VALUES.set(read_config_file(Path(config_file)) if config_file else None)
    try:
        return load(AgentSettings, **overrides)
    finally:
        _FILE_VALUES.reset(token)
