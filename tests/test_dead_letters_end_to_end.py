"""One bad record, one dead letter: the stream worker (every stage) and the sink together, on real parts, for every
raw topic and the records that used to split the consumers' checks."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import orjson
import pytest

from schemas.provision import ensure_topics
from core.settings import CommonSettings, load
from schemas.codec import encode
from schemas.dead_letter import original
from schemas.topics import FAULTS, HEALTH, NCCL, SAMPLES, TOPICS, XID
from tests.streams.helpers import gpu, sample
from tests.conftest import _free_port
from tests.pipeline import worker_and_sink
from tests.streams.broker import produce, read_all, wait_for

pytestmark = pytest.mark.integration


def good_records(t0: float) -> dict:
    samples = [sample(f"h{h}", t0 + k, [gpu(g) for g in range(8)], seq=k) for k in range(5) for h in range(3)]
    xids = [{"host": "h1", "ts": t0 + 2, "code": 13, "gpu_index": 1, "message": "Graphics Engine Exception"}]
    timings = [{"job": "j1", "rank": r, "world_size": 4, "host": f"h{r % 3}", "collective": "AllReduce", "seq": s,
                "bytes": 1 << 20, "ts": t0 + s, "compute_us": 900.0, "collective_us": 120.0}
               for s in range(5) for r in range(4)]
    return {SAMPLES: samples, XID: xids, NCCL: timings}


def bad_records(t0: float) -> dict:
    """Records that some consumers used to accept and others refuse, and some that no consumer can read."""
    s = sample("h0", t0 + 9, [gpu(g) for g in range(8)], seq=9)
    x = {"host": "h1", "ts": t0 + 9, "code": 79, "gpu_index": 1}
    t = {"job": "j1", "rank": 0, "world_size": 4, "host": "h0", "collective": "AllReduce", "seq": 9, "bytes": 1,
         "ts": t0 + 9, "compute_us": 900.0, "collective_us": 120.0}

    def gpu0(**fields):
        return orjson.dumps({**s, "gpus": [{**s["gpus"][0], **fields}] + s["gpus"][1:]})

    crowd = [{"index": i % 256, "uuid": f"GPU-{i}", "pci_bus_id": "0000:18:00.0"} for i in range(10_000)]
    return {
        SAMPLES: [(gpu0(power_w="450"), "$.gpus[0].power_w"), (orjson.dumps({**s, "ts": -5}), "$.ts"),
                  (gpu0(gpu_temp_c=True), "$.gpus[0].gpu_temp_c"), (gpu0(index=256), "$.gpus[0].index"),
                  (b"{not json", "not JSON"),
                  # size and shape: a 10,000-GPU sample (~0.6 MB), two readings for one GPU, a 300-character host, and
                  # 0.9 MB that is not JSON (its whole copy would not fit a dead letter: the producer's limit is 1 MB)
                  (orjson.dumps({**s, "gpus": crowd}), "length <= 256 - at `$.gpus`"),
                  (orjson.dumps({**s, "gpus": [s["gpus"][0], s["gpus"][0]]}), "index 0 appears twice"),
                  (orjson.dumps({**s, "host": "h" * 300}), "$.host"), (b"{" + b"x" * 900_000, "not JSON")],
        XID: [(orjson.dumps({**x, "code": "79"}), "$.code"), (orjson.dumps({**x, "ts": -5}), "$.ts"),
              (orjson.dumps({**x, "code": 2**40}), "$.code"), (orjson.dumps({**x, "gpu_index": 256}), "$.gpu_index")],
        NCCL: [(orjson.dumps({**t, "rank": 4}), "rank 4 is not below world_size 4"),
               (orjson.dumps({**t, "compute_us": "900"}), "$.compute_us"), (orjson.dumps({**t, "seq": True}), "$.seq")],
    }


async def test_each_bad_record_yields_exactly_one_dead_letter_in_the_whole_pipeline(settings_env, kafka_bootstrap,
                                                                                    topic_prefix, tmp_path):
    common = load(CommonSettings)
    await ensure_topics(common.kafka_client_args(), topic_prefix)
    t0 = time.time() - 600
    good, bad = good_records(t0), bad_records(t0)
    where: dict = {}  # topic -> {(partition, offset): expected reason}
    for topic, records in good.items():
        await produce(kafka_bootstrap, topic.full(topic_prefix), [(r[topic.key].encode(), encode(r)) for r in records])
        sent = await produce(kafka_bootstrap, topic.full(topic_prefix), [(b"h0", raw) for raw, _ in bad[topic]])
        where[topic] = {(m.partition, m.offset): why for m, (_, why) in zip(sent, bad[topic])}
    # A fault after the bad records: every stage that read them must still be working to turn it into a fault event.
    after = {"host": "h2", "ts": t0 + 20, "code": 79, "gpu_index": 5, "message": "GPU has fallen off the bus."}
    await produce(kafka_bootstrap, XID.full(topic_prefix), [(b"h2", orjson.dumps(after))])
    good[XID].append(after)

    async def settled() -> bool:
        """Every bad record refused by the worker's stages and dead-lettered by the sink; every good one stored."""
        text = log.read_text()
        refused = all(f"refused {t.full(topic_prefix)}[{p}]@{o}" in text for t, offs in where.items() for p, o in offs)
        stats = sink.stats.tables
        stored = (stats["gpu_samples"].rows == 8 * len(good[SAMPLES]) and stats["xid_events"].rows == len(good[XID])
                  and stats["nccl_timings"].rows == len(good[NCCL]))
        return refused and stored and all(stats[n].dead_letters == len(bad[t]) for n, t in
                                          (("gpu_samples", SAMPLES), ("xid_events", XID), ("nccl_timings", NCCL)))

    async def fault_of(host: str, code: str) -> list[dict]:
        records = await read_all(kafka_bootstrap, FAULTS.full(topic_prefix), FAULTS.partitions)
        return [f for f in map(orjson.loads, (r.value for r in records)) if (f["host"], f["code"]) == (host, code)]

    log, port = tmp_path / "worker.log", _free_port()
    async with worker_and_sink(log, env={"FLEETPULSE_STREAMS_METRICS_PORT": str(port)}) as sink:
        await wait_for("every record refused, stored or dead-lettered", settled, 120, log)
        faults = await wait_for("the fault after the bad records", lambda: fault_of("h2", "xid:79"), 30, log)
        scrape = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())
    # The worker counted each refused sample once, whatever number of its stages read the samples topic.
    assert f'fleetpulse_worker_refused_total{{topic="{SAMPLES.full(topic_prefix)}"}} {len(bad[SAMPLES]) * 1.0}' \
        in scrape.decode()
    assert 'fleetpulse_stage_received_total{stage="power_thermal"}' in scrape.decode()
    assert faults[0]["gpu_index"] == 5

    for topic in TOPICS.values():
        letters = [original(r.value) for r in await read_all(kafka_bootstrap, topic.dlq(topic_prefix), 1)]
        expected = where.get(topic, {})
        assert len(letters) == len(expected), (topic.name, [facts for facts, _ in letters])
        assert {(f["partition"], f["offset"]) for f, _ in letters} == set(expected)
        for facts, raw in letters:
            assert facts["component"] == "sink" and facts["source_topic"] == topic.full(topic_prefix)
            assert expected[(facts["partition"], facts["offset"])] in facts["reason"], facts
            assert facts["truncated"] == (facts["value_bytes"] > 256 * 1024) and len(raw) <= 256 * 1024


async def _allow_records_of(bootstrap: str, topic: str, max_bytes: int) -> None:
    """Let `topic` take records of up to `max_bytes` (Kafka's default is 1 MiB), as a cluster that allows large
    records would: the consumers' own limit must hold where the broker's does not."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  configs={"max.message.bytes": str(max_bytes)})])
    finally:
        await admin.close()


READERS = ("power_thermal", "fault_bins", "health", "stragglers", "silence")  # the stages that read the samples


async def _send_large(producer, topic: str, raw: bytes):
    """Send one record a default topic would refuse: the topic's raised limit reaches its partition leader a moment
    after the change is acknowledged (KRaft), so a refusal is tried again for a while."""
    from aiokafka.errors import MessageSizeTooLargeError

    for _ in range(40):
        try:
            return await producer.send_and_wait(topic, raw, key=b"h0")
        except MessageSizeTooLargeError:
            await asyncio.sleep(0.25)
    raise AssertionError(f"{topic} still refuses a record of {len(raw):,} bytes after its limit was raised")


async def test_samples_of_1_mb_10_mb_and_10000_gpus_get_one_dead_letter_each_that_fits_and_every_stage_goes_on(
        settings_env, kafka_bootstrap, topic_prefix, tmp_path):
    """Issue 9: each published among good samples; every stage that reads samples keeps working (samples after them
    are folded by each, a host first seen after them is scored, an XID after them becomes a fault), and each gets one
    dead letter that fits its topic."""
    from aiokafka import AIOKafkaProducer

    common = load(CommonSettings)
    await ensure_topics(common.kafka_client_args(), topic_prefix)
    topic = SAMPLES.full(topic_prefix)
    await _allow_records_of(kafka_bootstrap, topic, 16 << 20)
    t0 = time.time() - 600
    before = [sample(f"h{h}", t0 + k, [gpu(g) for g in range(8)], seq=k) for k in range(5) for h in range(3)]
    after = [sample(f"h{h}", t0 + k, [gpu(g) for g in range(8)], seq=k) for k in range(5, 10) for h in range(4)]
    s = before[0]
    crowd = [{"index": i % 256, "uuid": f"GPU-{i}", "pci_bus_id": "0000:18:00.0"} for i in range(10_000)]
    bad = [(b"{" + b"x" * 999_999, "not JSON"),  # 1 MB, under the size limit: read, and refused as what it is
           # 10 MB, well-formed (its padding an unknown key a consumer would drop): refused unread, for its size
           (orjson.dumps({**s, "seq": 90, "pad": "x" * 10_000_000}), "over FLEETPULSE_MAX_RECORD_BYTES=1,048,576"),
           (orjson.dumps({**s, "seq": 91, "gpus": crowd}), "length <= 256 - at `$.gpus`")]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", max_request_size=16 << 20)  # one at
    # a time, so in order; not idempotent: a send the broker refused would leave its sequence number out of order
    await producer.start()
    try:
        for r in before:
            await producer.send_and_wait(topic, encode(r), key=r["host"].encode())
        sent = [await _send_large(producer, topic, raw) for raw, _ in bad]
        for r in after:
            await producer.send_and_wait(topic, encode(r), key=r["host"].encode())
        xid = {"host": "h2", "ts": t0 + 20, "code": 79, "gpu_index": 5, "message": "GPU has fallen off the bus."}
        await producer.send_and_wait(XID.full(topic_prefix), orjson.dumps(xid), key=b"h2")
    finally:
        await producer.stop()
    where = {(m.partition, m.offset): why for m, (_, why) in zip(sent, bad)}
    good = len(before) + len(after)

    async def settled() -> bool:
        return stats.rows == 8 * good and stats.dead_letters == len(bad)

    async def fault() -> list[dict]:
        records = await read_all(kafka_bootstrap, FAULTS.full(topic_prefix), FAULTS.partitions)
        return [f for f in map(orjson.loads, (r.value for r in records)) if (f["host"], f["code"]) == ("h2", "xid:79")]

    async def scored_h3() -> list[dict]:  # a host whose first sample came after the bad ones
        records = await read_all(kafka_bootstrap, HEALTH.full(topic_prefix), HEALTH.partitions)
        return [r for r in map(orjson.loads, (r.value for r in records)) if r["host"] == "h3"]

    log, port = tmp_path / "worker.log", _free_port()
    async with worker_and_sink(log, env={"FLEETPULSE_STREAMS_METRICS_PORT": str(port)}) as sink:
        stats = sink.stats.tables["gpu_samples"]
        await wait_for("every good sample stored, every bad one dead-lettered", settled, 120, log)
        await wait_for("the XID after the bad samples, a fault", fault, 60, log)
        await wait_for("a host first seen after the bad samples, scored", scored_h3, 60, log)

        async def worker_done() -> str | None:  # its partitions run apart: h3's may be done before h0's
            text = (await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())).decode()
            counted = re.search(rf'^fleetpulse_worker_refused_total{{topic="{re.escape(topic)}"}} (\S+)$', text, re.M)
            return text if counted and float(counted[1]) >= len(bad) and all(
                float(re.search(rf'^fleetpulse_stage_received_total{{stage="{stage}"}} (\S+)$', text, re.M)[1]) >= good
                for stage in READERS) else None

        scrape = await wait_for("the worker's count of the bad samples and of the good ones", worker_done, 60, log)
    assert f'fleetpulse_worker_refused_total{{topic="{topic}"}} {len(bad) * 1.0}' in scrape  # once each
    for stage in READERS:  # every reader of the samples took every good one, those after the bad ones too
        assert f'fleetpulse_stage_crashes_total{{stage="{stage}"}} 0.0' in scrape, stage
    letters = [(facts, raw, r.value) for r in await read_all(kafka_bootstrap, SAMPLES.dlq(topic_prefix), 1)
               for facts, raw in [original(r.value)]]
    assert sorted((f["partition"], f["offset"]) for f, _, _ in letters) == sorted(where)
    for facts, raw, envelope in letters:
        assert where[(facts["partition"], facts["offset"])] in facts["reason"], facts["reason"]
        assert facts["component"] == "sink" and len(envelope) < 1 << 20  # it fits a topic of the default limit
        assert facts["truncated"] == (facts["value_bytes"] > 256 * 1024) and len(raw) <= 256 * 1024
    assert sorted(f["value_bytes"] for f, _, _ in letters)[1:] == [1_000_000, len(bad[1][0])]
