"""Process settings: one pydantic-settings class per role, validated at start-up from FLEETPULSE_* variables."""

from __future__ import annotations

import json
import re
import ssl
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from core.errors import ConfigError


class CommonSettings(BaseSettings):
    """What every process needs: where data lives, which broker, which ClickHouse."""

    model_config = SettingsConfigDict(env_prefix="FLEETPULSE_", extra="ignore", frozen=True)

    data_dir: Path = Field(default=Path(".fleetpulse"), description="local state: broker logs, chdb store, spool")
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        validation_alias=AliasChoices("FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
        description="existing Kafka cluster; unset = the project's local broker",
    )
    kafka_security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    kafka_sasl_mechanism: str | None = Field(default=None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with SASL")
    kafka_sasl_username: str | None = Field(default=None, description="SASL user")
    kafka_sasl_password: SecretStr | None = Field(default=None, description="SASL password (never logged)")
    kafka_ssl_cafile: Path | None = Field(default=None, description="CA bundle for SSL/SASL_SSL (default: system CAs)")
    kafka_ssl_certfile: Path | None = Field(default=None, description="client certificate for mutual TLS")
    kafka_ssl_keyfile: Path | None = Field(default=None, description="the client certificate's private key")
    local_kafka_port: int = Field(default=19092, ge=1024, le=65535, description="the local broker's client port; "
                                  "its controller takes the next one")
    local_kafka_nodes: int = Field(default=1, ge=1, le=5, description="the local broker: 1 node, or a KRaft cluster of "
                                   "this many nodes on loopback (node k listens on local_kafka_port + 2k)")
    kafka_replication: int | None = Field(default=None, ge=1, le=5, description="replicas of every topic fleetpulse "
                                          "creates; unset: 3 on a local cluster of 3+ nodes, else 1")
    clickhouse_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("FLEETPULSE_CLICKHOUSE_URL", "CLICKHOUSE_URL"),
        description="http[s]://[user:pass@]host:port of a server, or chdb:// (embedded, under data_dir) or "
                    "chdb:///path; unset = the project's local server (fleetpulse clickhouse start)",
    )
    local_clickhouse_http_port: int = Field(default=18123, ge=1024, le=65535,
                                            description="the local ClickHouse server's HTTP port")
    local_clickhouse_tcp_port: int = Field(default=19000, ge=1024, le=65535,
                                           description="the local ClickHouse server's native-protocol port")
    # One ClickHouse user per kind of work (core/clickhouse.py ROLES). Unset: on the local server its own users
    # (fleetpulse_<role>, passwords made at its first start under data_dir/clickhouse/passwords/); on another server
    # the URL's own user for every role.
    clickhouse_writer_user: str | None = Field(default=None, min_length=1, description="the sink's inserts")
    clickhouse_writer_password: SecretStr | None = Field(default=None, description="the writer's password")
    clickhouse_owner_user: str | None = Field(default=None, min_length=1, description="DDL and migrations")
    clickhouse_owner_password: SecretStr | None = Field(default=None, description="the owner's password")
    clickhouse_analyst_user: str | None = Field(default=None, min_length=1,
                                                description="read-only: query, report, page, Grafana")
    clickhouse_analyst_password: SecretStr | None = Field(default=None, description="the analyst's password")
    clickhouse_database: str = Field(
        default="fleetpulse", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the database of every table (not `default`: the local server's engine, clickhouse-local, makes "
                    "that one an overlay of its files, which no materialized view may read without READ ON FILE)")
    clickhouse_cluster: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="a cluster of the server's remote_servers: replicated tables with Distributed ones over them, "
                    "every statement ON CLUSTER (docs/cluster.md); needs FLEETPULSE_CLICKHOUSE_URL",
    )
    topic_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9._-]*$", description="namespace before every topic name")
    sink_port: int = Field(default=18125, ge=1024, le=65535, description="the sink's /status and /metrics (and "
                           "/query where it owns an embedded store)")
    page_port: int = Field(default=18124, ge=1024, le=65535, description="the fleet page (fleetpulse page, up)")
    sink_token: SecretStr | None = Field(default=None, description="bearer token the sink's endpoint requires")
    # Limits of one analyst's answer: the local server's analyst profile (ClickHouse enforces them) and the guard of
    # the embedded store (sinks/query_guard.py).
    query_max_rows: int = Field(default=1_000_000, ge=1, description="rows one answer may hold")
    query_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description="bytes one answer may hold")
    query_max_seconds: float = Field(default=30.0, gt=0, le=3600, description="longest query an analyst may run")
    query_max_memory_mb: int = Field(default=2048, ge=16, description="memory one query may use")
    # Retention tiers (schemas/ddl.py): per-second telemetry, scores, events and the rollups kept after the raw is gone.
    retention_telemetry_days: int = Field(default=30, ge=1, description="gpu_samples, nccl_timings")
    retention_scores_days: int = Field(default=90, ge=1, description="health_scores, stragglers")
    retention_events_days: int = Field(default=365, ge=1, description="XIDs, faults, alerts, lifecycle, drains, ...")
    retention_rollup_days: int = Field(default=730, ge=1, description="the per-minute, per-day and per-job rollups")
    # The rack power inventory: the worker's rack power alerts and the store's rack_1m view (power against budget).
    rack_budgets_w: dict[str, float] = Field(default_factory=dict, description='JSON {"rack": watts}')
    rack_inventory_file: Path | None = Field(default=None, description='JSON file {"rack": watts}, merged under')
    max_future_s: float = Field(default=2 * 86_400.0, gt=0, description="a record stamped further ahead of this "
                                "process's clock is refused (a host clock years ahead would freeze its state)")
    max_record_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20, description="a larger record is refused "
                                  "before it is decoded (Kafka's own default limit; a sample of 8 GPUs is ~8 KB)")

    @field_validator("kafka_security_protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        allowed = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if value not in allowed:
            raise ValueError(f"must be one of {sorted(allowed)}")
        return value

    @field_validator("rack_budgets_w")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [rack for rack, watts in value.items() if not watts > 0]
        if bad:
            raise ValueError(f"budgets must be positive watts; not for {bad}")
        return value

    def rack_budgets(self) -> dict[str, float]:
        """The inventory file's budgets, overridden by rack_budgets_w; empty means no rack alerts."""
        budgets: dict[str, float] = {}
        if self.rack_inventory_file is not None:
            try:
                raw = json.loads(self.rack_inventory_file.read_text())
                budgets = {str(rack): float(watts) for rack, watts in raw.items()}
            except (OSError, ValueError, AttributeError, TypeError) as exc:
                raise ConfigError(f"rack_inventory_file {self.rack_inventory_file}: {exc}") from exc
            if any(not w > 0 for w in budgets.values()):
                raise ConfigError(f"rack_inventory_file {self.rack_inventory_file}: budgets must be positive watts")
        return {**budgets, **self.rack_budgets_w}

    @property
    def bootstrap(self) -> str:
        """The broker(s) every component talks to."""
        return self.kafka_bootstrap_servers or ",".join(f"127.0.0.1:{self.local_kafka_port + 2 * k}"
                                                        for k in range(self.local_kafka_nodes))

    @property
    def replication(self) -> int:
        """Replicas of the topics fleetpulse creates (raw, derived, dead-letter, the worker's changelogs)."""
        if self.kafka_replication is not None:
            return self.kafka_replication
        return min(3, self.local_kafka_nodes) if self.uses_local_kafka and self.local_kafka_nodes >= 3 else 1

    @field_validator("clickhouse_cluster")
    @classmethod
    def _cluster_needs_server(cls, value: str | None, info) -> str | None:
        if value and not (info.data.get("clickhouse_url") or "").startswith(("http://", "https://")):
            raise ValueError("a cluster needs a ClickHouse server: set FLEETPULSE_CLICKHOUSE_URL to one of its nodes")
        return value

    @property
    def retention(self) -> dict[str, int]:
        """Days kept per retention tier."""
        return {"telemetry": self.retention_telemetry_days, "scores": self.retention_scores_days,
                "events": self.retention_events_days, "rollup": self.retention_rollup_days}

    @property
    def uses_local_kafka(self) -> bool:
        return self.kafka_bootstrap_servers is None

    @field_validator("clickhouse_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None or value.startswith("chdb://"):
            return value
        from core.clickhouse import redact  # (core.clickhouse reads these settings)

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{redact(value)!r} is not a store: give http[s]://host:port of a ClickHouse server, "
                             "chdb:// for the embedded store, or leave it unset for the local server")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"{redact(value)!r} has no valid port") from None
        return value

    @property
    def chdb_path(self) -> Path:
        return (self.data_dir / "chdb").resolve()

    @property
    def uses_local_clickhouse(self) -> bool:
        """True when the store is the project's own local server (`fleetpulse clickhouse start`)."""
        return self.clickhouse_url is None

    @property
    def local_clickhouse_home(self) -> Path:
        """Config, data, log and the role passwords of the local server."""
        return (self.data_dir / "clickhouse").resolve()

    @property
    def clickhouse_dsn(self) -> str:
        """The store as configured, with the URL's own credentials (if any): the local server when unset."""
        if self.clickhouse_url is None:
            return f"http://127.0.0.1:{self.local_clickhouse_http_port}"
        if self.clickhouse_url == "chdb://":
            return f"chdb://{self.chdb_path}"
        return self.clickhouse_url

    @property
    def embedded_store(self) -> bool:
        """True when ClickHouse runs in-process (chdb): only one process may open the store."""
        return self.clickhouse_dsn.startswith("chdb://")

    def clickhouse_credentials(self, role: str) -> tuple[str | None, str | None]:
        """(user, password) of `role` (writer, owner or analyst): its own settings; else the local server's user for
        it and the password made at that server's first start; else (None, None): the URL's own user."""
        user = getattr(self, f"clickhouse_{role}_user")
        secret = getattr(self, f"clickhouse_{role}_password")
        password = secret.get_secret_value() if secret is not None else None
        if self.uses_local_clickhouse:
            user = user or f"fleetpulse_{role}"
            if password is None:
                try:
                    password = (self.local_clickhouse_home / "passwords" / role).read_text().strip()
                except OSError:
                    password = None  # not started yet: the server refuses, and the caller says how to start it
        return user, password

    def clickhouse_dsn_as(self, role: str) -> str:
        """The store's URL logged in as `role`'s user (the embedded store has no users: the same path)."""
        dsn = self.clickhouse_dsn
        user, password = self.clickhouse_credentials(role)
        if self.embedded_store or user is None:
            return dsn
        parts = urlsplit(dsn)
        host = parts.netloc.rsplit("@", 1)[-1]
        login = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
        return urlunsplit(parts._replace(netloc=f"{login}@{host}"))

    def kafka_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of every Kafka client (agent, sink, admin, stream worker): the configured CA, client
        certificate and key; None for PLAINTEXT and SASL_PLAINTEXT."""
        if self.kafka_security_protocol not in ("SSL", "SASL_SSL"):
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            return create_ssl_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None,
                certfile=str(self.kafka_ssl_certfile) if self.kafka_ssl_certfile else None,
                keyfile=str(self.kafka_ssl_keyfile) if self.kafka_ssl_keyfile else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"FLEETPULSE_KAFKA_SSL_* files unusable: {exc}") from exc

    def kafka_client_args(self) -> dict:
        """Keyword arguments shared by aiokafka producers, consumers and admin clients."""
        args: dict = {"bootstrap_servers": self.bootstrap, "security_protocol": self.kafka_security_protocol}
        if (context := self.kafka_ssl_context()) is not None:  # aiokafka refuses TLS without a context
            args["ssl_context"] = context
        if self.kafka_sasl_mechanism:
            args["sasl_mechanism"] = self.kafka_sasl_mechanism
            args["sasl_plain_username"] = self.kafka_sasl_username
            if self.kafka_sasl_password is not None:
                args["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        return args


_QUOTED = re.compile(r'field "(\w+)"')


def load(cls: type[BaseSettings], **overrides) -> BaseSettings:
    """Build settings or fail with the offending field named (config errors stop start-up)."""
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{_where(cls, err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"invalid {cls.__name__}: {problems}") from exc
    except SettingsError as exc:  # a JSON setting that is not JSON: pydantic-settings names the field only
        field = _QUOTED.search(str(exc))
        where = _where(cls, (field.group(1),)) if field else "a setting"
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise ConfigError(f"invalid {cls.__name__}: {where}: not valid JSON{cause}; give it a JSON object, "
                          "or unset it for the default") from exc


def _where(cls: type[BaseSettings], loc: tuple) -> str:
    """The field as the operator set it: its environment variable name (and the field name)."""
    if not loc:
        return "<root>"
    field = str(loc[0])
    aliased = {choice: name for name, f in cls.model_fields.items()  # an aliased field is reported by its alias
               for choice in getattr(f.validation_alias, "choices", ())}
    field = aliased.get(field, field)
    info = cls.model_fields.get(field)
    alias = getattr(info.validation_alias, "choices", None) if info is not None else None
    env = str(alias[0]) if alias else f"{cls.model_config.get('env_prefix', '')}{field}".upper()
    rest = ".".join(str(p) for p in loc[1:])
    return f"{env} ({field}{'.' + rest if rest else ''})"
