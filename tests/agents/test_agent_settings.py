"""Agent settings (env over config file, errors name the field) and the collector registry's probes and messages."""

from __future__ import annotations

import asyncio
import http.server
import os
import threading

import pytest

from agents.nvml.collector import DeviceFault
from agents.nvml.fake import FakeNvml
from agents.registry import REGISTRY, fault_event
from agents.runner import AgentRunner
from agents.settings import COLLECTOR_NAMES, load_agent_settings
from core.errors import ConfigError
from schemas.telemetry import HostSample
from schemas.xid_catalog import first_bin


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """CI exports broker settings; these tests decide every value themselves."""
    for key in list(os.environ):
        if key.startswith("FLEETPULSE_") or key in ("KAFKA_BOOTSTRAP_SERVERS", "CLICKHOUSE_URL"):
            monkeypatch.delenv(key)


def test_a_toml_file_sets_values_and_the_environment_wins(tmp_path, monkeypatch):
    config = tmp_path / "agent.toml"
    config.write_text('agent_host = "gpu-node-0007"\nagent_rack = "r12"\nFLEETPULSE_AGENT_INTERVAL_S = 2.5\n'
                      'agent_collectors = ["nvml", "kernel_log"]\nkafka_bootstrap_servers = "kafka-1:9092"\n')
    monkeypatch.setenv("FLEETPULSE_AGENT_RACK", "r99")
    s = load_agent_settings(config)
    assert (s.agent_host, s.agent_rack, s.agent_interval_s) == ("gpu-node-0007", "r99", 2.5)
    assert s.agent_collectors == ["nvml", "kernel_log"] and s.bootstrap == "kafka-1:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-env:9092")
    assert load_agent_settings(config).bootstrap == "kafka-env:9092"
    assert load_agent_settings(config, agent_rack="cli").agent_rack == "cli"  # explicit arguments win over both


def test_a_json_file_and_the_defaults(tmp_path):
    config = tmp_path / "agent.json"
    config.write_text('{"agent_collectors": "dcgm, nvml", "agent_metrics_port": "off", "data_dir": "/var/lib/fp"}')
    s = load_agent_settings(config)
    assert s.agent_collectors == ["dcgm", "nvml"] and s.agent_metrics_port is None
    assert str(s.spool_dir) == "/var/lib/fp/spool"
    d = load_agent_settings()
    assert d.agent_interval_s == 10.0 and d.agent_metrics_port == 9464 and d.agent_host
    assert d.agent_status_every_s == 60.0
    assert d.agent_collectors == ["nvml", "nvml_xid", "kernel_log", "nccl_inspector", "infiniband"]


@pytest.mark.parametrize(("text", "suffix", "message"), [
    ("agent_interval_s = -1\n", ".toml", "FLEETPULSE_AGENT_INTERVAL_S (agent_interval_s)"),
    ('agent_collectors = "nvml,gpud"\n', ".toml", "unknown collectors ['gpud']"),
    ("agent_status_every_s = 0\n", ".toml", "FLEETPULSE_AGENT_STATUS_EVERY_S (agent_status_every_s)"),
    ("agent_status_every_s = 7200\n", ".toml", "FLEETPULSE_AGENT_STATUS_EVERY_S (agent_status_every_s)"),
    ('agent_kernel_log = "kern.log"\n', ".toml", "FLEETPULSE_AGENT_KERNEL_LOG (agent_kernel_log)"),
    ("agent_spool_fsync = \"sometimes\"\n", ".toml", "FLEETPULSE_AGENT_SPOOL_FSYNC"),
    ('agent_hots = "x"\n', ".toml", "unknown setting 'agent_hots'"),
    ("agent_host = \n", ".toml", "not valid TOML"),
    ('{"agent_host": ', ".json", "not valid JSON"),
    ("[1, 2]", ".json", "expected a table"),
])
def test_a_malformed_config_fails_at_start_up_naming_the_field(tmp_path, text, suffix, message):
    config = tmp_path / f"agent{suffix}"
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent_settings(config)
    assert message in str(err.value)


def test_every_collector_has_a_stable_registry_name():
    assert set(REGISTRY) == set(COLLECTOR_NAMES)
    assert all(REGISTRY[name].name == name for name in REGISTRY)


@pytest.mark.parametrize(("kind", "code", "action", "bin_"), [
    ("gpu_lost", 79, None, "reboot"), ("reset_required", 154, 1, "reset"), ("unknown_error", 154, None, "inspect")])
def test_a_device_fault_travels_as_an_xid_the_catalog_bins(kind, code, action, bin_):
    sample = HostSample(host="h", rack="r", cluster="c", ts=1.0, seq=0, gpus=[])
    fault = DeviceFault(kind, 2, "GPU-x", "0000:18:00.0", 15, "NVMLError_GpuIsLost", "nvmlDeviceGetPowerUsage", 5.0)
    event = fault_event(fault, sample)
    assert (event.code, event.recovery_action, event.gpu_index, event.source) == (code, action, 2, "nvml")
    assert event.ts == 5.0 and event.gpu_uuid == "GPU-x" and event.pci_bus_id == "0000:18:00.0"
    assert first_bin(event.code, recovery_action=event.recovery_action)[0].value == bin_
    assert kind in event.message and "nvmlDeviceGetPowerUsage" in event.message


def test_dcgm_exporter_sample_and_unsupported_collectors_are_values_not_crashes(reference_dir):
    text = (reference_dir / "dcgm_exporter_sample.txt").read_bytes()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = load_agent_settings(agent_host="t4-host", agent_job="job-9", agent_collectors="dcgm,nvml,nvml_xid",
                                       agent_dcgm_url=f"http://127.0.0.1:{server.server_port}/metrics")
        report = asyncio.run(AgentRunner(settings, nvml=FakeNvml(library_present=False)).once())
    finally:
        server.shutdown()
    (sample,) = [HostSample.model_validate(s) for s in report["fleet.telemetry.samples"]]
    assert (sample.source, sample.host, sample.job, sample.gpus[0].model) == ("dcgm", "t4-host", "job-9", "Tesla T4")
    assert report["collectors"]["nvml"] == {"supported": False, "reason": "nvmlInit: NVMLError_LibraryNotFound"}
    assert report["collectors"]["nvml_xid"]["supported"] is False
