"""The error tree: retryable vs fatal is decided where an error enters (config, Kafka, ClickHouse, NVML)."""


class FleetpulseError(Exception):
    """Base of every error fleetpulse raises on purpose."""

    retryable = False


class ConfigError(FleetpulseError):
    """Settings or an input file are malformed; start-up stops with the field named."""


class BrokerError(FleetpulseError):
    """The Kafka broker cannot be started, reached or verified."""

    retryable = True


class StoreError(FleetpulseError):
    """A ClickHouse call failed. `action` says what mends it (core/clickhouse.py ERRORS): WAIT, the same call later
    (the store is away, busy, over its quota or out of parts); SPLIT, a smaller insert (the store refused some rows
    themselves, so the records behind them can be found and set aside); STOP, nothing the caller can do (a missing
    table, a user without the right). `code` and `name`: ClickHouse's error, where it gave one."""

    WAIT, SPLIT, STOP = "wait", "split", "stop"

    def __init__(self, message: str, *, action: str = "stop", code: int | None = None, name: str | None = None):
        super().__init__(message)
        self.action = action
        self.code = code
        self.name = name

    @property
    def retryable(self) -> bool:
        return self.action == self.WAIT

    @property
    def bad_rows(self) -> bool:
        return self.action == self.SPLIT


class DecodeError(FleetpulseError):
    """A record could not be decoded or validated; it belongs in the dead-letter topic."""
