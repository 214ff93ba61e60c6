"""The contract: pydantic models for every message, the topic registry, JSON Schema and ClickHouse DDL."""
