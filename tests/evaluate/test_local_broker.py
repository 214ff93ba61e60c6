"""`fleetpulse evaluate` on the project's own broker: one it started is stopped at the end (or, kept, said to be left
running); one that already ran is left as it was."""

from __future__ import annotations

import socket

import pytest

from core.settings import CommonSettings, load
from fleetpulse.broker import LocalKafka
from fleetpulse.evaluate.plan import plan_from
from fleetpulse.evaluate.evaluation import Evaluation, Progress

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def free_port() -> int:
    """A free port whose next one is free too: the broker's controller listens on port + 1 (a CI run once found it
    taken by another connection's ephemeral port, and the broker could not start)."""
    while True:
        with socket.socket() as sock, socket.socket() as controller:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            try:
                controller.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


async def test_evaluate_stops_the_local_broker_it_started_and_leaves_one_it_found(settings_env, monkeypatch, tmp_path,
                                                                                 capsys):
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETPULSE_LOCAL_KAFKA_PORT", str(free_port()))
    monkeypatch.setenv("FLEETPULSE_DATA_DIR", str(tmp_path / "own"))
    settings = load(CommonSettings)
    assert settings.uses_local_kafka
    broker = LocalKafka(settings.data_dir, settings.local_kafka_port)

    async def evaluate(**options) -> dict:
        plan = plan_from("baseline", ["fleet.hosts=4", "run.duration_s=60"], **options)
        return await Evaluation(settings, plan, progress=Progress(every_s=60)).run()

    try:
        kept = await evaluate(keep_broker=True)
        assert kept["accounting"]["samples_gpu_rows"]["stored"] == kept["accounting"]["samples_gpu_rows"]["sent"] > 0
        assert broker.status()["running"]
        assert "stop it with `fleetpulse kafka stop`" in capsys.readouterr().err

        found = await evaluate()  # the broker ran before this run: not this run's to stop
        assert found["accounting"]["samples_gpu_rows"]["stored"] == found["accounting"]["samples_gpu_rows"]["sent"]
        assert broker.status()["running"]
        assert "broker" not in capsys.readouterr().err
        broker.stop()

        started = await evaluate()
        assert started["accounting"]["samples_gpu_rows"]["stored"] == started["accounting"]["samples_gpu_rows"]["sent"]
        assert not broker.status()["running"]
        assert "stopped the local Kafka broker this run started" in capsys.readouterr().err
    finally:
        broker.stop()
