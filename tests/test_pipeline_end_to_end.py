"""The whole pipeline on real parts: simulator -> Kafka -> stream worker -> sink -> ClickHouse, counted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.simulator.simulate import simulate
from core.settings import CommonSettings, load
from core.clickhouse import connect
from sinks.cli import run_sink
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]


def rows(settings, sql: str):
    return connect(settings, "owner").query(sql).result_rows


async def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def test_thermal_runaway_fires_and_resolves_and_every_sample_lands_once(settings_env, tmp_path):
    common = load(CommonSettings)
    sink_settings = load(SinkSettings, sink_batch_max_seconds=0.3, sink_http=False)
    log = tmp_path / "streams.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "fleetpulse.cli", "streams", "--stages", "power_thermal"],
        cwd=REPO, env={**os.environ, "FLEETPULSE_STREAMS_BATCH_WITHIN_S": "0.2"},
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    stop = asyncio.Event()
    sink = ClickHouseSink(sink_settings)
    sink_task = asyncio.create_task(run_sink(sink, stop))
    try:
        # GPU 3 of host 0 runs away 30 s in for 60 s (thermal-runaway.json); 200 s covers dwell and resolve.
        report = await simulate(common, hosts=6, duration=200, seed=3, scenario="thermal-runaway", speed=0,
                                start_ts=time.time() - 200, nccl_interval=0)
        assert report.sent["fleet.telemetry.samples"] == 6 * 200
        assert [t.kind for t in report.truth] == ["thermal_runaway"]

        def alerts():
            return rows(sink_settings, "SELECT alertname, status, host, gpu_index FROM alerts ORDER BY ts")

        def landed() -> bool:
            if sink_task.done():
                sink_task.result()  # the sink stopped: its error, not a timeout
            # The tables exist once the sink is ready (its schema applied): on a busy machine the simulator can be
            # done before that, and a query before it fails with UNKNOWN_TABLE instead of waiting.
            if not sink.stats.ready or sink.stats.tables["gpu_samples"].rows < report.gpu_readings:
                return False
            return any(s == "resolved" and a == "GpuTempSlowdown" for a, s, _, _ in alerts())
        await wait_for(landed, 120, "the runaway's alerts and every sample in ClickHouse")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_exit = await asyncio.to_thread(worker.wait, 30)
        stop.set()
        await asyncio.wait_for(sink_task, 30)
    assert worker_exit == 0, log.read_text()[-3000:]

    # Nothing lost, nothing doubled: exactly what the simulator says it sent, per GPU and second.
    assert rows(sink_settings, "SELECT count(), uniqExact(host, gpu_index, ts) FROM gpu_samples") == \
        [(report.gpu_readings, report.gpu_readings)]
    assert rows(sink_settings, "SELECT count() FROM sim_truth") == [(1,)]

    got = alerts()
    assert {(h, g) for _, _, h, g in got} == {("gpu-node-0000", 3)}, got
    by_name: dict[str, list[str]] = {}
    for name, status, _, _ in got:
        by_name.setdefault(name, []).append(status)
    assert by_name["GpuTempSlowdown"] == ["firing", "resolved"]
    assert all(statuses == ["firing", "resolved"] for statuses in by_name.values()), by_name
    # Every alert carries the inputs that produced it.
    evidence = rows(sink_settings, "SELECT value, threshold, mapKeys(evidence) FROM alerts "
                                   "WHERE alertname = 'GpuTempSlowdown' AND status = 'firing'")
    value, threshold, keys = evidence[0]
    assert value >= threshold == 89 and "gpu_temp_c" in keys
