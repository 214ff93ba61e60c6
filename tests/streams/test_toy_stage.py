"""Adding a stage is a package and one line: the toy stage (tests/streams/toy/) is installed by one entry-point line
and nothing else, and the real worker on the real broker runs it with its own setting, metrics and dead letters."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import urllib.request
from importlib.metadata import EntryPoint
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.errors import ConfigError
from schemas.codec import encode
from schemas.dead_letter import original
from schemas.provision import ensure_topics
from schemas.topics import ALERTS, SAMPLES
from streams import registry
from tests.conftest import REPO, free_ports
from tests.streams.helpers import gpu, sample
from tests.streams.broker import produce, read_all, stop_worker, wait_for
from tests.streams.toy.stage import STAGE

ELSEWHERE = dataclasses.replace(STAGE, worker="elsewhere")


def installed(at: Path) -> str:
    """A distribution's metadata whose one line of substance names the toy stage; returns a PYTHONPATH that has it."""
    info = at / "fleetpulse_toy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetpulse-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\ntoy = tests.streams.toy.stage:STAGE\n")
    return os.pathsep.join([str(REPO), str(at)])


def worker(path: str, toy: str, log: Path, port: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": path, "FLEETPULSE_TOY": toy, "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2",
           **({"FLEETPULSE_STREAMS_METRICS_PORT": str(port), "FLEETPULSE_STREAMS_METRICS_ADDR": "127.0.0.1"}
              if port else {})}
    return subprocess.Popen([sys.executable, "-m", "fleetpulse.cli", "streams", "--stages", "toy"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def test_the_toy_is_not_a_stage_until_its_line_is_installed():
    assert "toy" not in registry.STAGES


@pytest.mark.parametrize("value, says", [
    ("tests.streams.toy.stage:step", "is a function, not a StageSpec"),
    ("streams.health.stage:STAGE", "a stage named 'health' is already registered"),
    ("tests.streams.test_toy_stage:ELSEWHERE", "worker 'elsewhere' is not one of telemetry, decisions"),
])
def test_an_installed_stage_that_cannot_run_stops_start_up_with_its_entry_point_named(value, says, monkeypatch):
    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint("site", value, group)])
    with pytest.raises(ConfigError, match=re.escape(f"entry point site = {value} ({registry.ENTRY_POINTS})") + ".*"
                       + re.escape(says)):
        registry.installed(registry.BUILT_IN)


def test_a_bad_toy_setting_stops_the_worker_at_start_up_with_its_name(settings_env, tmp_path):
    log = tmp_path / "worker.log"
    proc = worker(installed(tmp_path / "site"), '{"hot": 80}', log)
    assert proc.wait(timeout=60) != 0
    text = log.read_text()
    assert "FLEETPULSE_TOY (toy.hot): Extra inputs are not permitted" in text and "Traceback" not in text, text


@pytest.mark.integration
async def test_a_stage_installed_by_one_line_runs_with_its_setting_metrics_and_dead_letters(
        settings_env, kafka_bootstrap, topic_prefix, tmp_path):
    await ensure_topics({"bootstrap_servers": kafka_bootstrap}, topic_prefix)
    log, port = tmp_path / "worker.log", free_ports(1)
    # 85 C fires only at the setting's 80 (the model's default is 90); h9's records make the toy's rules raise
    proc = worker(installed(tmp_path / "site"), '{"hot_c": 80, "refuse_host": "h9"}', log, port)
    try:
        records = [sample(host, 1_000.0, [gpu(0, temp), gpu(1, 60.0)]) for host, temp in
                   (("h0", 85.0), ("h1", 79.0), ("h9", 85.0))]
        sent = await produce(kafka_bootstrap, SAMPLES.full(topic_prefix),
                             [(r["host"].encode(), encode(r)) for r in records])

        async def fired():
            alerts = [orjson.loads(r.value) for r in await read_all(kafka_bootstrap, ALERTS.full(topic_prefix),
                                                                    ALERTS.partitions)]
            return [a for a in alerts if a["alertname"] == "ToyHotGpu"] or None

        alerts = await wait_for("the toy's alert", fired, 90, log)
        assert [(a["host"], a["gpu_index"], a["value"], a["threshold"]) for a in alerts] == [("h0", 0, 85.0, 80.0)]

        async def dead_lettered():
            return [original(r.value) for r in await read_all(kafka_bootstrap, SAMPLES.dlq(topic_prefix), 1)] or None

        letters = await wait_for("the refused record's dead letter", dead_lettered, 60, log)
        (where, _), = letters
        assert (where["partition"], where["offset"]) == (sent[2].partition, sent[2].offset)
        assert where["component"] == "streams.toy" and "toy refuses h9" in where["reason"], where

        def scrape() -> dict[str, float]:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return {f"{s.name}{dict(sorted(s.labels.items()))}": s.value for f in text_string_to_metric_families(text)
                    for s in f.samples if s.labels.get("stage") == "toy"}

        got = scrape()
        assert got["fleetpulse_stage_received_total{'stage': 'toy'}"] == 3, got
        assert got["fleetpulse_stage_emitted_total{'stage': 'toy'}"] == 1, got
        assert got["fleetpulse_stage_errors_total{'stage': 'toy'}"] == 1, got
        assert got["fleetpulse_stage_state_entries{'stage': 'toy'}"] == 2, got  # h0 and h1; h9's write was dropped
    except BaseException:
        stop_worker(proc, log, failing=True)
        raise
    stop_worker(proc, log)
    assert "[toy] ToyHotGpu h0 gpu=0 85.0 C" in log.read_text()  # the runtime's log, with the stage's name
