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
    """A ClickHouse write or schema check failed."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class DecodeError(FleetpulseError):
    """A record could not be decoded or validated; it belongs in the dead-letter topic."""
