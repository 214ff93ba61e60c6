"""The topic registry: every Kafka topic's name, key, value model, partitioning, compaction and retention."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from core.errors import DecodeError

from schemas.analytics import (
    Alert, DrainEvent, FaultEvent, HealthScore, InjectedFault, NodeState, RemediationResult, StragglerScore,
    UsableCompute,
)
from schemas.events import AgentStatus, HostEvent, NcclStep, NcclTiming, XidEvent, step_of
from schemas.network import NetSample
from schemas.telemetry import HostSample
from schemas.validate import validator

DAY_MS = 24 * 3600 * 1000
DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class Topic:
    name: str
    key: str  # the value field whose value is the record key
    model: type[BaseModel]
    partitions: int
    retention_ms: int
    compacted: bool = False
    description: str = ""
    # An older record form the topic still carries (records already on it, agents not yet upgraded): its model, and
    # how a checked record of it becomes `model`'s form. Tried when a record is not `model`'s.
    legacy: tuple[type[BaseModel], Callable[[dict], dict]] | None = None
    # Consumers refuse a record whose Kafka key is not its `key` field (decode_keyed): the raw topics, written by
    # agents and third-party producers, whose records the keyed stages fold into per-host (per-job) state. The
    # pipeline's own outputs key some records otherwise on purpose (a rack's power alert by its rack).
    key_checked: bool = False
    # Every host (job) sends it every interval: the bulk of a stream. A stage reading it and an event topic takes the
    # events first when behind (streams/runtime/inbox.py), so a fault is not held behind a backlog of samples; the
    # sink may wait longer to fill its batches than an event stream's (sink_periodic_batch_max_seconds).
    periodic: bool = False

    def full(self, prefix: str = "") -> str:
        """The topic's name on the cluster: a namespace prefix (e.g. 'staging.') before the registry name."""
        return prefix + self.name

    def dlq(self, prefix: str = "") -> str:
        return prefix + self.name + DLQ_SUFFIX

    def key_of(self, value: dict) -> bytes:
        return str(value[self.key]).encode()

    def decode(self, raw: bytes | None) -> dict:
        """A record's value, decoded and checked by the topic's one validator (schemas/validate.py)."""
        try:
            return validator(self.model).decode(raw)
        except DecodeError as exc:
            return self._legacy(exc, lambda model: validator(model).decode(raw))

    def decode_keyed(self, key: bytes | None, raw: bytes | None) -> dict:
        """decode(), and on a key_checked topic the record's Kafka key must be its `key` field: every keyed stage and
        table relies on one host's (or job's) records sharing a partition, in order. A record keyed otherwise is
        refused like a bad one."""
        value = self.decode(raw)
        if self.key_checked and key != self.key_of(value):
            raise DecodeError(f"record key {key!r:.80} is not its {self.key} {str(value[self.key])!r:.80}")
        return value

    def check(self, value: object) -> dict:
        """An already decoded value, checked by the same validator."""
        try:
            return validator(self.model).check(value)
        except DecodeError as exc:
            return self._legacy(exc, lambda model: validator(model).check(value))

    def _legacy(self, exc: DecodeError, read: Callable[[type[BaseModel]], Any]) -> dict:
        """A record that is not `model`'s: the legacy form's, upgraded, if it is one; else the first error. A record
        is taken for the legacy form when the current form's first required field it lacks is one of the legacy
        form's absent fields (NcclTiming has no `ranks`)."""
        if self.legacy is None or "missing required field" not in str(exc):
            raise exc
        model, upgrade = self.legacy
        return upgrade(read(model))

    def config(self) -> dict[str, str]:
        """Kafka topic configs for creation."""
        if self.compacted:
            return {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


# Partition counts are chosen up front: faust tables cannot be re-partitioned later.
_TOPICS = [
    Topic("fleet.telemetry.samples", "host", HostSample, 8, 3 * DAY_MS, key_checked=True, periodic=True,
          description="one sample per host per interval"),
    Topic("fleet.telemetry.xid", "host", XidEvent, 8, 14 * DAY_MS, key_checked=True, description="XID / SXid events"),
    Topic("fleet.telemetry.nccl", "job", NcclStep, 8, 3 * DAY_MS, legacy=(NcclTiming, step_of), key_checked=True,
          periodic=True,
          description="collective timings, one record per host and collective (per-rank NcclTiming still read)"),
    Topic("fleet.telemetry.agent", "host", AgentStatus, 8, 7 * DAY_MS, key_checked=True, periodic=True,
          description="each host agent's own condition: collectors running and failing, an orderly stop"),
    Topic("fleet.telemetry.net", "host", NetSample, 8, 3 * DAY_MS, key_checked=True, periodic=True,
          description="one sample of every InfiniBand/RoCE port per host per interval: state, rate, error counters"),
    Topic("fleet.telemetry.host_events", "host", HostEvent, 8, 14 * DAY_MS, key_checked=True,
          description="kernel-log lines about the host: NIC (mlx5), NVMe/block I/O, filesystem, machine checks"),
    Topic("fleet.health.scores", "host", HealthScore, 8, 7 * DAY_MS, periodic=True,
          description="GPU and node health scores"),
    Topic("fleet.faults", "host", FaultEvent, 8, 30 * DAY_MS, description="binned fault events"),
    Topic("fleet.stragglers", "job", StragglerScore, 8, 7 * DAY_MS, periodic=True,
          description="per-rank straggler scores"),
    Topic("fleet.alerts", "host", Alert, 8, 30 * DAY_MS, description="power/thermal alerts, fire and resolve"),
    Topic("fleet.node.state", "host", NodeState, 8, -1, compacted=True, description="node lifecycle state"),
    Topic("fleet.drain.events", "host", DrainEvent, 8, 30 * DAY_MS, description="drain/repair/validate requests"),
    Topic("fleet.remediation.results", "host", RemediationResult, 8, 30 * DAY_MS, description="remediation bot results"),
    Topic("fleet.usable_compute", "scope", UsableCompute, 1, 365 * DAY_MS, periodic=True,
          description="usable compute per minute, with its breakdown"),
    Topic("fleet.sim.truth", "host", InjectedFault, 1, 30 * DAY_MS, description="simulator ground truth"),
]

TOPICS: dict[str, Topic] = {t.name: t for t in _TOPICS}

SAMPLES = TOPICS["fleet.telemetry.samples"]
XID = TOPICS["fleet.telemetry.xid"]
NCCL = TOPICS["fleet.telemetry.nccl"]
AGENT = TOPICS["fleet.telemetry.agent"]
NET = TOPICS["fleet.telemetry.net"]
HOST_EVENTS = TOPICS["fleet.telemetry.host_events"]
HEALTH = TOPICS["fleet.health.scores"]
FAULTS = TOPICS["fleet.faults"]
STRAGGLERS = TOPICS["fleet.stragglers"]
ALERTS = TOPICS["fleet.alerts"]
NODE_STATE = TOPICS["fleet.node.state"]
DRAIN = TOPICS["fleet.drain.events"]
REMEDIATION = TOPICS["fleet.remediation.results"]
USABLE = TOPICS["fleet.usable_compute"]
TRUTH = TOPICS["fleet.sim.truth"]


@dataclass(frozen=True)
class InternalTopic:
    """A topic between one worker's stages: named under the worker's app id (its consumer group), co-partitioned with
    the stage's inputs, never read by the sink. Its records' shapes belong to the stages that write and read them;
    a record they refuse goes to the dead-letter topic of the public topic it was derived from."""

    name: str
    key: str
    partitions: int
    dead_letters: Topic
    description: str = ""

    def full(self, app_id: str) -> str:
        return f"{app_id}-{self.name}"


def topic(name: str) -> Topic:
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; known: {', '.join(TOPICS)}") from None


# Internal topics, next to the public ones: the stream worker creates them (streams/cli.py) before it subscribes.
_INTERNAL = [
    InternalTopic("power_thermal-rack_power", "rack", SAMPLES.partitions, SAMPLES,
                  "each host's power per sample, re-keyed by rack for the rack budget rules"),
    InternalTopic("stragglers-by_host", "host", SAMPLES.partitions, NCCL,
                  "straggler candidates re-keyed by the rank's host, to meet its GPU condition"),
    InternalTopic("health-stragglers_by_host", "host", SAMPLES.partitions, STRAGGLERS,
                  "flagged (or just cleared) ranks re-keyed by host, to meet the host's health state"),
    InternalTopic("silence-fleet", "kind", 1, SAMPLES,
                  "each host's last sign of life and each job's last collective, for the one fleet-wide judge"),
    InternalTopic("lifecycle-decisions", "host", HEALTH.partitions, DRAIN,
                  "the breaker's answers to drain proposals, back to the node's partition"),
    InternalTopic("lifecycle-fleet", "kind", 1, DRAIN,
                  "drain proposals, validation bandwidths, usable-compute shares and breaker resets: one fleet step"),
]
INTERNAL: dict[str, InternalTopic] = {t.name: t for t in _INTERNAL}
RACK_POWER = INTERNAL["power_thermal-rack_power"]
STRAGGLERS_BY_HOST = INTERNAL["stragglers-by_host"]
HEALTH_STRAGGLERS = INTERNAL["health-stragglers_by_host"]
SILENCE_FLEET = INTERNAL["silence-fleet"]
LIFECYCLE_DECISIONS = INTERNAL["lifecycle-decisions"]
LIFECYCLE_FLEET = INTERNAL["lifecycle-fleet"]
