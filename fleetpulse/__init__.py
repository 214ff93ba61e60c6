"""fleetpulse: GPU-fleet telemetry from host collectors through Kafka and faust stages into ClickHouse."""

__version__ = "0.1.0"
