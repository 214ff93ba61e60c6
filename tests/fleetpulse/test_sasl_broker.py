"""A broker with SASL_SSL and SCRAM-SHA-512 over a private CA: the agent's publisher, the stream worker and the sink
connect with the same FLEETPULSE_KAFKA_* settings; with a wrong password every process says authentication failed,
and no log line, error or dead letter anywhere holds a password."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.publisher import Publisher
from core.settings import CommonSettings, load
from fleetpulse.broker import LocalKafka, TlsListener
from schemas.provision import ensure_topics
from schemas.topics import SAMPLES, TOPICS
from core.clickhouse import connect
from tests.conftest import REPO, _free_port
from tests.fleetpulse.test_tls_broker import make_pki
from tests.pipeline import worker_and_sink
from tests.streams.helpers import temps_series
from tests.streams.broker import wait_for

pytestmark = pytest.mark.integration
PASSWORD, WRONG = "canary-Right-7f3a9c", "canary-Wrong-51be04"  # grepped for everywhere at the end


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("sasl")
    pki = make_pki(root)
    broker = LocalKafka(root, port=_free_port(), controller_port=_free_port(),
                        tls=TlsListener(_free_port(), pki["keystore"], pki["ca"], client_auth=False,
                                        scram_users=(("fleetpulse", PASSWORD),)))
    broker.start()
    try:
        yield broker, pki, root
    finally:
        broker.stop()


def sasl_env(broker, pki, password: str, **extra) -> dict[str, str]:
    return {"FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS": f"localhost:{broker.tls.port}",
            "FLEETPULSE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FLEETPULSE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "FLEETPULSE_KAFKA_SASL_USERNAME": "fleetpulse", "FLEETPULSE_KAFKA_SASL_PASSWORD": password,
            "FLEETPULSE_KAFKA_SSL_CAFILE": str(pki["ca"]), **extra}


async def test_agent_worker_and_sink_connect_with_scram_over_tls(sasl_broker, clickhouse_url, clickhouse_database,
                                                                 topic_prefix, tmp_path, monkeypatch):
    broker, pki, _ = sasl_broker
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    for key, value in sasl_env(broker, pki, PASSWORD, FLEETPULSE_TOPIC_PREFIX=topic_prefix,
                               FLEETPULSE_CLICKHOUSE_URL=clickhouse_url,
                               FLEETPULSE_CLICKHOUSE_DATABASE=clickhouse_database,
                               FLEETPULSE_DATA_DIR=str(tmp_path / "data")).items():
        monkeypatch.setenv(key, value)
    common = load(CommonSettings)
    await ensure_topics(common.kafka_client_args(), topic_prefix)
    samples = temps_series("h1", [60.0] * 3 + [90.5] * 6, t0=time.time() - 600)
    log = tmp_path / "worker.log"
    async with worker_and_sink(log, "power_thermal") as sink:
        async with Publisher(common, client_id="sasl-test") as pub:
            for s in samples:
                await pub.send(SAMPLES, s)
            await pub.flush()

        async def alert_stored():
            if not sink.stats.ready:
                return False
            rows = connect(sink.settings, "owner").query("SELECT alertname, status, host FROM alerts").result_rows
            return ("GpuTempSlowdown", "firing", "h1") in rows and sink.stats.tables["gpu_samples"].rows == 2 * 9
        await wait_for("the worker's alert, stored by the sink, all over SASL_SSL/SCRAM", alert_stored, 90, log)
    letters = []
    consumer = AIOKafkaConsumer(**common.kafka_client_args(), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t.dlq(topic_prefix), 0) for t in TOPICS.values()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        for batch in (await consumer.getmany(timeout_ms=3000)).values():
            letters += [r.value for r in batch]
    finally:
        await consumer.stop()
    assert not any(PASSWORD.encode() in v for v in letters)
    assert PASSWORD not in log.read_text()


def test_a_wrong_password_is_an_authentication_failure_in_every_process(sasl_broker, tmp_path):
    broker, pki, root = sasl_broker
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(sasl_env(broker, pki, WRONG, FLEETPULSE_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(REPO),
                        FLEETPULSE_CLICKHOUSE_URL=f"chdb://{tmp_path / 'chdb'}", FLEETPULSE_AGENT_METRICS_PORT="off",
                        FLEETPULSE_AGENT_KERNEL_LOG=os.devnull, FLEETPULSE_AGENT_INTERVAL_S="0.5"))
    cli = [sys.executable, "-m", "fleetpulse.cli"]
    outputs = {}
    for name in ("sink", "streams"):  # they cannot work without the broker: they stop, saying why
        done = subprocess.run([*cli, name], env=env, cwd=REPO, capture_output=True, timeout=120)
        outputs[name] = done.stdout + done.stderr
        assert done.returncode == 2, outputs[name].decode()[-2000:]
        assert b"authentication failed (SCRAM-SHA-512 as 'fleetpulse')" in done.stderr.splitlines()[-1], \
            outputs[name].decode()[-2000:]
    agent = subprocess.Popen([*cli, "agent", "--fake-nvml"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # an agent keeps sampling into its spool, and says why
    time.sleep(12)
    agent.terminate()
    out, err = agent.communicate(timeout=60)
    outputs["agent"] = out + err
    assert agent.returncode == 0, err.decode()[-2000:]
    assert b"authentication failed (SCRAM-SHA-512 as 'fleetpulse')" in err, err.decode()[-2000:]
    for name, text in outputs.items():  # the canary: neither password in any output
        assert WRONG.encode() not in text and PASSWORD.encode() not in text, name
    broker_log = (root / "kafka" / "server.log").read_bytes()
    assert WRONG.encode() not in broker_log and PASSWORD.encode() not in broker_log
