"""The app factory, stage registry, settings and counters, without a broker."""

from __future__ import annotations

import json

import faust
import pytest

from core.errors import ConfigError
from core.settings import load
from schemas.topics import ALERTS, RACK_POWER, SAMPLES
from streams.faust_adapter.app import QuietMonitor, broker_credentials, create_app, metrics_of
from streams.groups import app_id
from streams.faust_adapter.worker import changelog_topics
from streams.metrics import StageMetrics
from streams.metrics_server import exposition
from streams.power_thermal import stage as power_thermal
from streams.registry import STAGES, WORKERS, select
from streams.settings import StreamsSettings, streams_settings


def settings(tmp_path, **kw) -> StreamsSettings:
    return load(StreamsSettings, kafka_bootstrap_servers="k1:9092,k2:9092", topic_prefix="ns.", data_dir=tmp_path, **kw)


def test_app_is_namespaced_and_configured_from_settings(tmp_path):
    app = create_app(settings(tmp_path), stages=["power_thermal"])
    assert app.conf.id == app_id("ns.") == "ns.fleetpulse-streams"
    assert [str(u) for u in app.conf.broker] == ["kafka://k1:9092", "kafka://k2:9092"]
    assert app.conf.topic_partitions == SAMPLES.partitions and app.conf.store.scheme == "memory"
    assert app.conf.consumer_auto_offset_reset == "earliest" and not app.conf.web_enabled
    assert app.conf.value_serializer == "raw" and app.conf.datadir == tmp_path / "streams"
    agents = app.fleetpulse.agents["power_thermal"]
    assert [a.name for a in agents] == ["lane.telemetry"]  # a runtime stage runs in its lane's agent
    assert all(a.concurrency == 1 for a in agents)
    assert list(agents[0].channel.topics) == ["ns.fleet.telemetry.samples", "ns.fleetpulse-streams-power_thermal-rack_power"]
    changelogs = {t.changelog_topic.get_topic_name(): t.partitions for t in app.tables.values()}
    assert changelogs == {"ns.fleetpulse-streams-power_thermal-hosts-changelog": 8,
                          "ns.fleetpulse-streams-power_thermal-racks-changelog": 8}


def test_changelogs_close_their_segments_so_the_broker_compacts_them(tmp_path):
    """faust restores a memory table from its changelog's start; the cleaner compacts only closed segments, and by
    Kafka's defaults a segment stays open for 7 days. Both faust's own declaration and the worker's (made before it
    subscribes, and aligned on topics an earlier version made) carry the setting."""
    app = create_app(settings(tmp_path, streams_changelog_segment_s=90), stages=["power_thermal"])
    made = changelog_topics(app, 1)
    assert {nt.name for nt in made} == {t.changelog_topic.get_topic_name() for t in app.tables.values()}
    assert all(nt.topic_configs == {"cleanup.policy": "compact", "segment.ms": "90000"} for nt in made)
    assert all(t.changelog_topic.config == {"segment.ms": "90000"} for t in app.tables.values())
    default = create_app(settings(tmp_path), stages=["power_thermal"])
    assert {nt.topic_configs["segment.ms"] for nt in changelog_topics(default, 1)} == {"600000"}
    with pytest.raises(ConfigError, match="STREAMS_CHANGELOG_SEGMENT_S"):
        settings(tmp_path, streams_changelog_segment_s=0)


def test_the_app_s_monitor_keeps_no_per_record_bookkeeping(tmp_path):
    """faust calls each sensor four times per record; its Monitor's counters only feed faust's web pages (off)."""
    app = create_app(settings(tmp_path), stages=["power_thermal"])
    app.on_init_dependencies()
    assert isinstance(app.monitor, QuietMonitor) and app.monitor in set(app.sensors)
    app.monitor.on_message_in(None, 0, None)
    assert app.monitor.on_stream_event_in(None, 0, None, None) is None
    assert app.monitor.messages_received_total == 0 and app.monitor.events_total == 0


def test_rack_budgets_reach_both_rule_sets(tmp_path):
    inventory = tmp_path / "racks.json"
    inventory.write_text(json.dumps({"r1": 40_000, "r2": 30_000}))
    s = settings(tmp_path, rack_inventory_file=inventory, rack_budgets_w={"r2": 25_000.0})
    assert s.rack_budgets() == {"r1": 40_000.0, "r2": 25_000.0}
    cfg = power_thermal.config(s)
    assert cfg.hosts.rack_budgets_w == cfg.racks.budgets_w == {"r1": 40_000.0, "r2": 25_000.0}


def test_every_registered_stage_wires_into_its_worker_with_concurrency_one_and_namespaced_state(tmp_path):
    apps = {w: create_app(settings(tmp_path), worker=w) for w in WORKERS}
    assert sorted(name for app in apps.values() for name in app.fleetpulse.agents) == sorted(STAGES)
    assert set(apps["decisions"].fleetpulse.agents) == {"lifecycle"}
    assert {w: app.conf.id for w, app in apps.items()} == {"telemetry": "ns.fleetpulse-streams",
                                                          "decisions": "ns.fleetpulse-streams-decisions"}
    for app in apps.values():
        assert all(a.concurrency == 1 for a in app.agents.values())  # faust 0.15.3 loses offsets above 1
    # changelogs keep the namespace's names whichever worker (consumer group) writes them
    changelogs = {t.changelog_topic.get_topic_name() for app in apps.values() for t in app.tables.values()}
    assert {"ns.fleetpulse-streams-lifecycle-nodes-changelog", "ns.fleetpulse-streams-health-hosts-changelog",
            "ns.fleetpulse-streams-stragglers-jobs-changelog"} <= changelogs
    assert all(name.startswith("ns.fleetpulse-streams-") and "decisions" not in name for name in changelogs)
    with pytest.raises(ConfigError, match="run in workers telemetry, decisions"):
        create_app(settings(tmp_path))
    with pytest.raises(ConfigError, match="worker 'decisions' runs none of the stages"):
        create_app(settings(tmp_path), stages=["health"], worker="decisions")


def test_stage_selection_and_config_errors(tmp_path, monkeypatch):
    assert [s.name for s in select(None)] == list(STAGES)
    assert STAGES["power_thermal"].topics() == (SAMPLES,) and STAGES["power_thermal"].outputs == (ALERTS, RACK_POWER)
    with pytest.raises(ConfigError, match="unknown stage.*nope"):
        create_app(settings(tmp_path), stages=["power_thermal", "nope"])
    monkeypatch.setenv("FLEETPULSE_STAGES", "power_thermal, ")
    assert streams_settings().stages == ["power_thermal"]
    monkeypatch.setenv("FLEETPULSE_RACK_BUDGETS_W", '{"r1": -5}')
    with pytest.raises(ConfigError, match="rack_budgets_w"):
        streams_settings()
    monkeypatch.delenv("FLEETPULSE_RACK_BUDGETS_W")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="rack_inventory_file"):
        settings(tmp_path, rack_inventory_file=bad).rack_budgets()


def test_security_settings_become_faust_credentials(tmp_path):
    assert broker_credentials(settings(tmp_path)) is None
    sasl = broker_credentials(settings(tmp_path, kafka_security_protocol="SASL_SSL",
                                       kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="u",
                                       kafka_sasl_password="p"))
    assert isinstance(sasl, faust.SASLCredentials) and sasl.protocol.value == "SASL_SSL"
    assert (sasl.username, sasl.password, sasl.mechanism.value) == ("u", "p", "SCRAM-SHA-512")
    ssl_only = broker_credentials(settings(tmp_path, kafka_security_protocol="SSL"))
    assert isinstance(ssl_only, faust.SSLCredentials)


def test_counters_read_in_tests_and_as_the_served_prometheus_text(tmp_path):
    app = create_app(settings(tmp_path), stages=["power_thermal"])
    m = metrics_of(app)["power_thermal"]
    m.received, m.emitted, m.errors, m.state_entries = 10, 2, 1, 7
    m.observe_batch(0.003, newest_ts_ms=1_000_000, now=1_004.5)
    m.observe_batch(0.2)
    metrics_of(app).refused["ns.fleet.telemetry.samples"] += 3
    text = exposition(metrics_of(app), lag=lambda: {"power_thermal": 42})
    assert 'fleetpulse_stage_received_total{stage="power_thermal"} 10.0' in text
    assert 'fleetpulse_stage_errors_total{stage="power_thermal"} 1.0' in text
    assert 'fleetpulse_stage_batch_seconds_bucket{le="0.005",stage="power_thermal"} 1.0' in text
    assert 'fleetpulse_stage_batch_seconds_bucket{le="+Inf",stage="power_thermal"} 2.0' in text
    assert 'fleetpulse_stage_lag_seconds{stage="power_thermal"} 4.5' in text  # a batch without timestamps keeps it
    assert 'fleetpulse_stage_state_entries{stage="power_thermal"} 7.0' in text
    assert 'fleetpulse_worker_refused_total{topic="ns.fleet.telemetry.samples"} 3.0' in text
    assert 'fleetpulse_stage_lag_records{stage="power_thermal"} 42.0' in text
    assert (m.batches, m.latency.max_s, StageMetrics("x").batches) == (2, 0.2, 0)


def test_lanes_share_no_refusal_count_and_every_topic_is_counted_once(tmp_path):
    app = create_app(settings(tmp_path), worker="decisions")
    lanes = {lane.name: lane for lane in app.fleetpulse.lanes}
    assert set(lanes) == {"decisions", "fleet"}
    read = [t for lane in lanes.values() for t in lane.sources]
    counted = [t for lane in lanes.values() for t in lane.counts]
    assert sorted(set(read)) == sorted(counted)  # each topic's refusals are counted by exactly one lane
    assert "ns.fleet.faults" in lanes["decisions"].counts
    telemetry = create_app(settings(tmp_path), worker="telemetry").fleetpulse.lanes
    assert [lane.name for lane in telemetry] == ["telemetry", "nccl", "silence"]
    assert "ns.fleet.telemetry.samples" in telemetry[0].counts
    assert "ns.fleet.faults" in telemetry[0].sources  # health reads faults too: a worker of its own counts them again
    assert "ns.fleet.telemetry.samples" not in lanes["decisions"].sources  # drains never wait behind samples
    assert {a.name for a in app.fleetpulse.agents["lifecycle"]} == {"lane.decisions", "lane.fleet"}


async def test_the_worker_s_producer_is_idempotent(tmp_path):
    """A stage's output resent after a broker died mid-request is written once (acks=all plus idempotence)."""
    app = create_app(settings(tmp_path), stages=["power_thermal"])
    producer = app.producer._new_producer()  # the aiokafka producer faust starts, not started here
    assert producer._txn_manager is not None and producer.client._bootstrap_servers == ["k1:9092", "k2:9092"]
