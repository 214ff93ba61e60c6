"""Malformed configuration stops start-up with the variable named; valid configuration derives the rest."""

import os
import subprocess
import sys

import pytest

from core.errors import ConfigError
from core.settings import CommonSettings, load
from sinks.settings import SinkSettings


def _clean(monkeypatch, tmp_path) -> None:
    for var in [v for v in os.environ if v.startswith("FLEETPULSE_")] + ["KAFKA_BOOTSTRAP_SERVERS", "CLICKHOUSE_URL"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FLEETPULSE_DATA_DIR", str(tmp_path))


def test_defaults_point_at_the_local_broker_and_the_local_clickhouse_server(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    s = load(CommonSettings)
    assert s.uses_local_kafka and s.bootstrap == "127.0.0.1:19092"
    assert s.uses_local_clickhouse and not s.embedded_store and s.clickhouse_dsn == "http://127.0.0.1:18123"
    # each role logs in as the local server's user for it, with the password its first start made
    assert s.clickhouse_credentials("analyst") == ("fleetpulse_analyst", None)
    passwords = tmp_path / "clickhouse" / "passwords"
    passwords.mkdir(parents=True)
    (passwords / "writer").write_text("p@ss:w/rd\n")
    assert s.clickhouse_dsn_as("writer") == "http://fleetpulse_writer:p%40ss%3Aw%2Frd@127.0.0.1:18123"


def test_the_embedded_store_is_chosen_by_its_url(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    s = load(CommonSettings, clickhouse_url="chdb://")
    assert s.embedded_store and s.clickhouse_dsn == f"chdb://{tmp_path.resolve()}/chdb"
    assert s.clickhouse_dsn_as("owner") == s.clickhouse_dsn  # no users there
    assert load(CommonSettings, clickhouse_url="chdb:///var/fp").clickhouse_dsn == "chdb:///var/fp"


def test_a_server_url_keeps_its_user_unless_a_role_names_its_own(monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path)
    monkeypatch.setenv("FLEETPULSE_CLICKHOUSE_URL", "https://admin:s3cret@ch.example:8443/?secure=1")
    s = load(CommonSettings)
    assert s.clickhouse_dsn_as("writer") == "https://admin:s3cret@ch.example:8443/?secure=1"
    monkeypatch.setenv("FLEETPULSE_CLICKHOUSE_ANALYST_USER", "grafana")
    monkeypatch.setenv("FLEETPULSE_CLICKHOUSE_ANALYST_PASSWORD", "ro")
    s = load(CommonSettings)
    assert s.clickhouse_dsn_as("analyst") == "https://grafana:ro@ch.example:8443/?secure=1"
    assert s.clickhouse_dsn_as("owner") == "https://admin:s3cret@ch.example:8443/?secure=1"


@pytest.mark.parametrize("url", ["nonsense", "localhost:8123", "ftp://ch:21", "http://:8123", "http://ch:port"])
def test_a_store_url_that_is_no_store_fails_at_start_up_with_the_fix(monkeypatch, tmp_path, url):
    _clean(monkeypatch, tmp_path)
    monkeypatch.setenv("FLEETPULSE_CLICKHOUSE_URL", url)
    with pytest.raises(ConfigError,
                       match=r"FLEETPULSE_CLICKHOUSE_URL \(clickhouse_url\): .*(not a store|no valid port)"):
        load(CommonSettings)


def test_unprefixed_standard_variables_name_external_services(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("CLICKHOUSE_URL", "https://u:p@ch:8443")
    s = load(CommonSettings)
    assert not s.uses_local_kafka and s.bootstrap == "k1:9092,k2:9092"
    assert not s.embedded_store


@pytest.mark.parametrize(
    "var, value, named",
    [
        ("FLEETPULSE_LOCAL_KAFKA_PORT", "ninety", "FLEETPULSE_LOCAL_KAFKA_PORT (local_kafka_port)"),
        ("FLEETPULSE_KAFKA_SECURITY_PROTOCOL", "CARRIER_PIGEON", "FLEETPULSE_KAFKA_SECURITY_PROTOCOL"),
        ("FLEETPULSE_TOPIC_PREFIX", "has space", "FLEETPULSE_TOPIC_PREFIX (topic_prefix)"),
        ("FLEETPULSE_SINK_BATCH_MAX_ROWS", "0", "FLEETPULSE_SINK_BATCH_MAX_ROWS (sink_batch_max_rows)"),
    ],
)
def test_malformed_values_fail_with_the_variable_named(monkeypatch, var, value, named):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match="invalid SinkSettings: .*" + named.replace("(", r"\(").replace(")", r"\)")):
        load(SinkSettings)


def test_the_cli_refuses_to_start_on_bad_config_and_says_why(tmp_path):
    env = {"FLEETPULSE_SINK_PORT": "70000", "PATH": "/usr/bin:/bin", "FLEETPULSE_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "fleetpulse.cli", "query", "SELECT 1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "FLEETPULSE_SINK_PORT (sink_port)" in done.stderr and "less than or equal to 65535" in done.stderr


def test_tls_protocols_get_an_ssl_context_for_aiokafka(monkeypatch):
    import ssl

    monkeypatch.setenv("FLEETPULSE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FLEETPULSE_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("FLEETPULSE_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("FLEETPULSE_KAFKA_SASL_PASSWORD", "p")
    args = load(CommonSettings).kafka_client_args()
    assert isinstance(args["ssl_context"], ssl.SSLContext)
    assert args["sasl_plain_password"] == "p" and args["security_protocol"] == "SASL_SSL"
    monkeypatch.setenv("FLEETPULSE_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    assert "ssl_context" not in load(CommonSettings).kafka_client_args()


def test_a_local_cluster_is_bootstrapped_by_every_node_and_replicates_three_ways(monkeypatch):
    for var in [v for v in os.environ if v.startswith("FLEETPULSE_")] + ["KAFKA_BOOTSTRAP_SERVERS"]:
        monkeypatch.delenv(var, raising=False)
    one = load(CommonSettings)
    assert (one.bootstrap, one.replication) == ("127.0.0.1:19092", 1)
    three = load(CommonSettings, local_kafka_nodes=3, local_kafka_port=20000)
    assert (three.bootstrap, three.replication) == ("127.0.0.1:20000,127.0.0.1:20002,127.0.0.1:20004", 3)
    assert load(CommonSettings, local_kafka_nodes=3, kafka_replication=2).replication == 2  # said outright: as said
    external = load(CommonSettings, local_kafka_nodes=3, kafka_bootstrap_servers="k1:9092,k2:9092")
    assert (external.bootstrap, external.replication) == ("k1:9092,k2:9092", 1)  # unknown cluster: not assumed
