"""SpoolingPublisher on the session broker: direct delivery, a broker that is away at start, shutdown, the next run."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from agents.spool import Spool, SpoolingPublisher
from core.errors import BrokerError
from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.topics import NCCL, SAMPLES
from tests.agents.test_publisher import consume_all
from tests.conftest import _free_port

pytestmark = pytest.mark.integration


async def test_records_go_straight_to_a_healthy_broker_without_touching_the_spool(settings_env, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    pub = SpoolingPublisher(settings, Spool(tmp_path / "spool"))
    await pub.start()
    assert pub.connected
    for i in range(200):
        await pub.send(SAMPLES, {"host": f"gpu-node-{i % 4:04d}", "seq": i // 4})
    assert await pub.flush(timeout=30)
    await pub.close()
    assert pub.sent == {"fleet.telemetry.samples": 200} and pub.spooled == 0 and pub.replayed == 0
    assert not list((tmp_path / "spool").glob("seg-*"))
    by_host: dict[bytes, list[int]] = {}
    for r in await consume_all(settings, SAMPLES, 200):
        by_host.setdefault(r.key, []).append(orjson.loads(r.value)["seq"])
    assert by_host == {f"gpu-node-{h:04d}".encode(): list(range(50)) for h in range(4)}


async def test_an_unreachable_broker_spools_and_the_next_run_delivers_in_order(settings_env, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    away = settings.model_copy(update={"kafka_bootstrap_servers": f"127.0.0.1:{_free_port()}"})  # nothing listens
    first = SpoolingPublisher(away, Spool(tmp_path / "spool"), connect_timeout_s=2)
    await first.start()  # no exception: an agent starts before its broker does
    assert not first.connected
    for i in range(300):
        await first.send(NCCL, {"job": f"job-{i % 3}", "rank": 0, "seq": i // 3})
    started = time.monotonic()
    await first.close(timeout=1.0)  # delivers nothing, keeps everything
    assert time.monotonic() - started < 8
    assert first.spooled == 300 and first.sent == {} and first.spool_bytes > 0

    second = SpoolingPublisher(settings, Spool(tmp_path / "spool"))  # the agent restarted; the broker is back
    await second.start()
    assert await second.flush(timeout=30)
    assert second.replayed == 300 and second.sent == {"fleet.telemetry.nccl": 300} and len(second.spool) == 0
    await second.send(NCCL, {"job": "job-0", "rank": 0, "seq": 100})  # new records after the replayed ones
    await second.close()
    seqs: dict[bytes, list[int]] = {}
    for r in await consume_all(settings, NCCL, 301):
        seqs.setdefault(r.key, []).append(orjson.loads(r.value)["seq"])
    assert seqs == {b"job-0": list(range(101)), b"job-1": list(range(100)), b"job-2": list(range(100))}


async def test_a_record_the_broker_can_never_take_is_refused_and_counted(settings_env, tmp_path):
    settings = load(CommonSettings)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    pub = SpoolingPublisher(settings, Spool(tmp_path / "spool"), max_request_size=4096)
    await pub.start()
    with pytest.raises(BrokerError, match="refused"):
        await pub.send(SAMPLES, {"host": "gpu-node-0000", "blob": "y" * 10_000})
    await pub.send(SAMPLES, {"host": "gpu-node-0001", "blob": "small"})
    await pub.close()
    assert pub.failed == {"fleet.telemetry.samples": 1} and pub.sent == {"fleet.telemetry.samples": 1}
    assert pub.spooled == 0


async def test_send_after_close_is_an_error(tmp_path):
    pub = SpoolingPublisher(CommonSettings(kafka_bootstrap_servers=f"127.0.0.1:{_free_port()}"),
                            Spool(tmp_path), connect_timeout_s=1)
    with pytest.raises(RuntimeError, match="not running"):
        await pub.send(SAMPLES, {"host": "h"})
    await pub.start()
    await pub.close(timeout=0.1)
    with pytest.raises(RuntimeError, match="not running"):
        await asyncio.wait_for(pub.send(SAMPLES, {"host": "h"}), 5)
