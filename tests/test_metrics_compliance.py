"""Every role against the catalogue it declares (fleetpulse/metrics_catalogue.py, docs/metrics.md): the shared words
mean one thing everywhere, and on the real broker every stage, the sink and a bot read the same good and malformed
records and are checked the same way: what they serve is what they declare, each counts what it received and
refused, and each malformed record has exactly one dead letter, with its reason."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterable

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bots.ledger import Ledger
from bots.metrics import CATALOGUE as BOT, registry_for as bot_registry
from bots.runner import BotRunner, Outcome, Steps
from core.metrics import SHARED, MetricSpec
from core.settings import CommonSettings, load
from fleetpulse.metrics_catalogue import roles
from schemas.analytics import DrainEvent
from schemas.codec import encode
from schemas.dead_letter import original
from schemas.provision import ensure_topics
from schemas.topics import DRAIN, NCCL, SAMPLES, XID
from sinks.status import CATALOGUE as SINK, exposition as sink_exposition
from streams import registry
from streams.metrics_server import CATALOGUE as WORKER
from tests.conftest import _free_port
from tests.pipeline import worker_and_sink
from tests.streams.helpers import gpu, sample
from tests.streams.broker import produce, read_all, wait_for


def test_each_shared_word_has_one_kind_and_no_name_means_two_things():
    every = [(role.name, spec) for role in roles() for spec in role.catalogue]
    names = [spec.name for _, spec in every]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for role, spec in every:
        assert spec.name.startswith("fleetpulse_") and spec.kind in ("counter", "gauge", "histogram"), (role, spec)
        if spec.thing is not None:  # named after a shared word: its kind, and its name ends with it
            assert spec.kind == SHARED[spec.thing][0] and spec.name.endswith(f"_{spec.thing}"), (role, spec)
        else:  # a role's own metric is not a shared word under another kind
            assert spec.name.rsplit("_", 1)[-1] not in ("received", "emitted", "refused"), (role, spec)
    # what every role that takes records must say about them
    for role in roles():
        declared = {spec.thing for spec in role.catalogue}
        if role.name != "lag watch":
            assert {"received", "emitted", "errors", "batch_seconds"} <= declared, role.name


def served(text: str, catalogue: Iterable[MetricSpec]) -> dict[str, dict[tuple, float]]:
    """The scrape's fleetpulse_ families, each checked against its catalogue entry (kind and labels); returns name ->
    {labels: value} (a histogram's: its count)."""
    declared = {spec.name: spec for spec in catalogue}
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("fleetpulse_"):
            continue
        spec = declared.get(family.name)
        assert spec is not None, f"{family.name} is served but not in the catalogue"
        assert family.type == spec.kind, (family.name, family.type, spec.kind)
        values = out.setdefault(family.name, {})
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            assert set(labels) == set(spec.labels), (family.name, labels, spec.labels)
            if spec.kind != "histogram" or s.name.endswith("_count"):
                values[tuple(sorted(labels.items()))] = s.value
    missing = {spec.name for spec in catalogue if spec.thing} - set(out)
    assert not missing, f"declared and not served: {sorted(missing)}"
    return out


def total(values: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for key, v in values.get(name, {}).items() if want <= set(key))


class Answers:
    """The bot's executor: every host is ours and every action succeeds. The runner, its ledger, its counts and its
    metrics are the production ones; what a scheduler would do is not what this test is about (Slurm's bot runs on a
    real slurmctld in tests/bots/test_slurm_bot_end_to_end.py)."""

    async def cluster_id(self) -> str:
        return "compliance"

    async def serves(self, host: str) -> bool:
        return True

    async def act(self, event: dict, steps: Steps) -> Outcome:
        return Outcome(True, f"{event['action']} done")


@pytest.mark.integration
async def test_every_stage_the_sink_and_a_bot_count_the_same_records_the_same_way(settings_env, kafka_bootstrap,
                                                                                 topic_prefix, tmp_path):
    common = load(CommonSettings)
    await ensure_topics(common.kafka_client_args(), topic_prefix)
    t0 = time.time() - 120
    good = {SAMPLES: [sample(f"h{h}", t0 + k, [gpu(g) for g in range(8)], seq=k) for k in range(4) for h in range(2)],
            XID: [{"host": "h1", "ts": t0 + 2, "code": 13, "gpu_index": 1, "message": "Graphics Engine Exception"}],
            NCCL: [{"job": "j1", "rank": r, "world_size": 2, "host": f"h{r}", "collective": "AllReduce", "seq": s,
                    "bytes": 1 << 20, "ts": t0 + s, "compute_us": 900.0, "collective_us": 120.0}
                   for s in range(4) for r in range(2)],
            DRAIN: [DrainEvent(event_id=f"ev-c{k}", host=f"h{k}", action="drain", ts=time.time(), reason="test")
                    .model_dump(mode="json") for k in range(2)]}
    bad = {SAMPLES: [b"{not json", orjson.dumps({**good[SAMPLES][0], "ts": -5})],
           XID: [orjson.dumps({**good[XID][0], "code": "13"})],
           NCCL: [orjson.dumps({**good[NCCL][0], "rank": 2})],
           DRAIN: [orjson.dumps({**good[DRAIN][0], "event_id": "ev-bad", "action": "explode"})]}
    where: dict = {}
    for topic in good:
        await produce(kafka_bootstrap, topic.full(topic_prefix),
                      [(r[topic.key].encode(), encode(r)) for r in good[topic]])
        sent = await produce(kafka_bootstrap, topic.full(topic_prefix), [(b"h0", raw) for raw in bad[topic]])
        where[topic] = {(m.partition, m.offset) for m in sent}

    bot_stop = asyncio.Event()
    runner = BotRunner(common, Answers(), Ledger(tmp_path / "ledger.jsonl"), f"{topic_prefix}compliance-bot")
    bot = asyncio.create_task(runner.run(bot_stop))
    log, port = tmp_path / "worker.log", _free_port()
    async with worker_and_sink(log, env={"FLEETPULSE_STREAMS_METRICS_PORT": str(port)}) as sink:
        tables = sink.stats.tables

        async def settled() -> bool:
            return (tables["gpu_samples"].dead_letters == len(bad[SAMPLES])
                    and tables["xid_events"].dead_letters == len(bad[XID])
                    and tables["nccl_timings"].dead_letters == len(bad[NCCL])
                    and tables["drain_events"].dead_letters == len(bad[DRAIN])
                    and tables["gpu_samples"].rows == 8 * len(good[SAMPLES])
                    and runner.counts.malformed == len(bad[DRAIN]) and len(runner.ledger.entries) >= len(good[DRAIN]))

        def scrape(at: int) -> dict[str, dict[tuple, float]] | None:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{at}/metrics", timeout=5).read().decode()
            except OSError:
                return None  # not serving yet
            return served(text, WORKER)

        async def stages_done() -> dict | None:
            """Both workers' metrics (telemetry on the port, decisions, a child process, on the next one), merged."""
            values: dict[str, dict[tuple, float]] = {}
            for at in (port, port + 1):
                if (scraped := await asyncio.to_thread(scrape, at)) is None:
                    return None
                for name, got in scraped.items():
                    for key, v in got.items():
                        values.setdefault(name, {})[key] = values.get(name, {}).get(key, 0.0) + v
            received = {stage: total(values, "fleetpulse_stage_received", stage=stage)
                        for stage in (s.name for s in registry.select(None))}
            refused = total(values, "fleetpulse_worker_refused")
            return values if all(received.values()) and refused == sum(map(len, (bad[SAMPLES], bad[XID],
                                                                                  bad[NCCL]))) else None

        await wait_for("every malformed record dead-lettered, every good sample stored, the bot's requests taken",
                       settled, 120, log)
        worker = await wait_for("every stage received records, every refusal counted", stages_done, 60, log)

        async def answered() -> bool:
            return runner.counts.answered.get("drain", 0) >= len(good[DRAIN]) and not runner.ledger.unsettled()
        await wait_for("the bot answered both requests", answered, 60, log)
        assert runner._workers == {} and runner._queues == {}  # a host's task ends with its last request
        sink_values = served(sink_exposition(sink.stats).decode(), SINK)
    bot_stop.set()
    await asyncio.wait_for(bot, 30)
    bot_values = served(generate_latest(bot_registry("compliance", runner.counts, runner.ledger)).decode(), BOT)

    # received and refused, the same way in each role: by its own label, summed
    for topic, table in ((SAMPLES, "gpu_samples"), (XID, "xid_events"), (NCCL, "nccl_timings"),
                         (DRAIN, "drain_events")):
        assert total(sink_values, "fleetpulse_sink_refused", table=table) == len(bad[topic]), table
        assert total(sink_values, "fleetpulse_sink_received", table=table) >= len(good[topic]) + len(bad[topic])
        if topic is not DRAIN:
            assert total(worker, "fleetpulse_worker_refused", topic=topic.full(topic_prefix)) == len(bad[topic])
    assert total(bot_values, "fleetpulse_bot_refused") == len(bad[DRAIN])
    assert total(bot_values, "fleetpulse_bot_received") >= len(good[DRAIN]) + len(bad[DRAIN])
    assert total(bot_values, "fleetpulse_bot_emitted", action="drain") >= len(good[DRAIN])
    # work that went well: no errors, batches timed, lags measured, state held
    for values, errors in ((worker, "fleetpulse_stage_errors"), (bot_values, "fleetpulse_bot_errors")):
        assert total(values, errors) == 0, errors
    assert total(worker, "fleetpulse_stage_batch_seconds", stage="health") >= 1
    assert 0 <= total(worker, "fleetpulse_stage_lag_seconds", stage="power_thermal") < 600
    assert total(worker, "fleetpulse_stage_state_entries", stage="health") >= 2  # two hosts scored
    assert total(sink_values, "fleetpulse_sink_batch_seconds", table="gpu_samples") >= 1
    assert 0 <= total(sink_values, "fleetpulse_sink_lag_seconds", table="gpu_samples") < 600
    assert 0 <= total(bot_values, "fleetpulse_bot_lag_seconds") < 600

    # one dead letter per malformed record, written once in the whole pipeline (by the sink), with its reason
    for topic, offsets in where.items():
        letters = [original(r.value) for r in await read_all(kafka_bootstrap, topic.dlq(topic_prefix), 1)]
        assert {(f["partition"], f["offset"]) for f, _ in letters} == offsets and len(letters) == len(offsets), topic
        assert all(f["component"] == "sink" and f["reason"] for f, _ in letters), letters
