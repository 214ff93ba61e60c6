"""A broker with a private CA and mutual TLS: the agent's publisher, the stream worker and the sink all connect with the
same FLEETPULSE_KAFKA_SSL_* settings, and a client without a certificate is refused."""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from pathlib import Path

import pytest
from aiokafka.helpers import create_ssl_context
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agents.publisher import Publisher
from fleetpulse.broker import LocalKafka, TlsListener, round_trip
from core.errors import BrokerError
from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.topics import SAMPLES
from core.clickhouse import connect
from tests.conftest import _free_port
from tests.streams.helpers import temps_series
from tests.pipeline import worker_and_sink
from tests.streams.broker import wait_for

pytestmark = pytest.mark.integration


def _cert(subject: str, key, issuer: x509.Name | None, signer, *, ca: bool, sans=()) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(root: Path) -> dict[str, Path]:
    """A private CA, a broker certificate for localhost and a client certificate, as PEM files."""
    ca_key, broker_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("fleetpulse test CA", ca_key, None, ca_key, ca=True)
    broker = _cert("localhost", broker_key, ca.subject, ca_key, ca=False,
                   sans=(x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))))
    client = _cert("fleetpulse-client", client_key, ca.subject, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    files = {"ca": ca.public_bytes(pem), "keystore": _pem_key(broker_key) + broker.public_bytes(pem) + ca.public_bytes(pem),
             "client_cert": client.public_bytes(pem), "client_key": _pem_key(client_key)}
    out = {}
    for name, data in files.items():
        out[name] = root / f"{name}.pem"
        out[name].write_bytes(data)
    return out


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    pki = make_pki(root)
    broker = LocalKafka(root, port=_free_port(), controller_port=_free_port(),
                        tls=TlsListener(_free_port(), pki["keystore"], pki["ca"], client_auth=True))
    broker.start()
    try:
        yield broker, pki
    finally:
        broker.stop()


async def test_a_client_without_the_ca_or_a_certificate_is_refused(tls_broker):
    broker, pki = tls_broker
    bootstrap = f"localhost:{broker.tls.port}"
    with pytest.raises(BrokerError):  # the system CAs do not know the private CA
        await round_trip(bootstrap, timeout=5, security_protocol="SSL", ssl_context=create_ssl_context())
    with pytest.raises(BrokerError):  # the CA, but no client certificate: mutual TLS refuses it
        await round_trip(bootstrap, timeout=5, security_protocol="SSL", ssl_context=create_ssl_context(
            cafile=str(pki["ca"])))


async def test_agent_worker_and_sink_share_the_tls_settings(tls_broker, clickhouse_url, clickhouse_database,
                                                            topic_prefix, tmp_path, monkeypatch):
    broker, pki = tls_broker
    env = {"FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS": f"localhost:{broker.tls.port}",
           "FLEETPULSE_KAFKA_SECURITY_PROTOCOL": "SSL", "FLEETPULSE_KAFKA_SSL_CAFILE": str(pki["ca"]),
           "FLEETPULSE_KAFKA_SSL_CERTFILE": str(pki["client_cert"]),
           "FLEETPULSE_KAFKA_SSL_KEYFILE": str(pki["client_key"]), "FLEETPULSE_TOPIC_PREFIX": topic_prefix,
           "FLEETPULSE_CLICKHOUSE_URL": clickhouse_url, "FLEETPULSE_CLICKHOUSE_DATABASE": clickhouse_database,
           "FLEETPULSE_DATA_DIR": str(tmp_path / "data")}
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    common = load(CommonSettings)
    await ensure_topics(common.kafka_client_args(), topic_prefix)
    t0 = time.time() - 600
    samples = temps_series("h1", [60.0] * 3 + [90.5] * 6, t0=t0)  # GPU 0 past its 89 C slowdown limit for 25 s

    log = tmp_path / "worker.log"
    async with worker_and_sink(log, "power_thermal") as sink:
        async with Publisher(common, client_id="tls-test") as pub:  # the host agent's publisher
            for s in samples:
                await pub.send(SAMPLES, s)
            await pub.flush()

        async def alert_stored():
            if not sink.stats.ready:  # its tables are made before it starts consuming
                return False
            rows = connect(sink.settings, "owner").query(
                "SELECT alertname, status, host, gpu_index FROM alerts").result_rows
            return ("GpuTempSlowdown", "firing", "h1", 0) in rows and sink.stats.tables["gpu_samples"].rows == 2 * 9
        await wait_for("the worker's alert, stored by the sink, all over mutual TLS", alert_stored, 90, log)
