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
    """A ClickHouse write or schema check failed. `bad_rows`: the store refused some of the rows themselves (a value
    a column cannot hold, a constraint), so the records behind them can be found and set aside."""

    def __init__(self, message: str, *, retryable: bool = False, bad_rows: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.bad_rows = bad_rows


class DecodeError(FleetpulseError):
    """A record could not be decoded or validated; it belongs in the dead-letter topic."""
