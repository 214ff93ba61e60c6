"""`fleetpulse bot slurm` against a real slurmctld and a real broker: drain events in, scontrol actions on real nodes,
one answer per event out. Every test counts what it sent and what came back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.analytics import DrainEvent
from schemas.codec import encode
from schemas.provision import ensure_topics
from schemas.topics import DRAIN, REMEDIATION
from tests.bots.slurm_cluster import BINARIES, PACKAGES, SlurmCluster
from tests.conftest import free_ports, require_system

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    for binary in BINARIES:
        require_system("the Slurm bot's end-to-end test", PACKAGES, binary)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), ["n1", "n2", "n3"], free_ports(5)).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster(slurm):
    slurm.reset()
    return slurm


class Bot:
    """The bot as operators run it: its own process, killed or stopped like one."""

    def __init__(self, env: dict, log: Path):
        self.env, self.log, self.proc = env, log, None

    def start(self) -> Bot:
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetpulse.cli", "bot", "slurm"], env=self.env,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def bot_env(settings_env, cluster, reference_dir, tmp_path):
    checks = tmp_path / "checks.log"
    config = {
        "poll_s": 0.3,
        "dcgm_diag_command": ["sh", "-c", f"echo dcgm r{{level}} {{node}} >> {checks}"],
        "nccl_command": ["sh", "-c", f"echo nccl {{node}} >> {checks}; cat {reference_dir / 'nccl_tests_sample.txt'}"],
        "command_timeout_s": 60,
    }
    return {**os.environ, **settings_env, "SLURM_CONF": str(cluster.conf), "FLEETPULSE_BOT_SLURM": json.dumps(config),
            "FLEETPULSE_BOT_GROUP_ID": f"bot-{uuid.uuid4().hex[:8]}", "CHECKS": str(checks)}


@pytest.fixture
def bot(bot_env, tmp_path):
    bots = []

    def start(env: dict | None = None) -> Bot:
        bots.append(Bot(env or bot_env, tmp_path / "bot.log").start())
        return bots[-1]

    yield start
    for b in bots:
        b.stop()


def event(host: str, action: str, **kw) -> DrainEvent:
    return DrainEvent(event_id=f"ev-{uuid.uuid4().hex[:10]}", host=host, action=action, ts=time.time(),
                      reason=kw.pop("reason", f"test {action}"), **kw)


def publish(env: dict, events: list[DrainEvent]) -> None:
    async def go():
        client = {"bootstrap_servers": env["FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"]}
        await ensure_topics(client, prefix=env["FLEETPULSE_TOPIC_PREFIX"])
        producer = AIOKafkaProducer(**client)
        await producer.start()
        try:
            for e in events:
                await producer.send_and_wait(DRAIN.full(env["FLEETPULSE_TOPIC_PREFIX"]), encode(e), key=e.host.encode())
        finally:
            await producer.stop()

    asyncio.run(go())


def results(env: dict, want: int, timeout: float = 60, settle: float = 0.0) -> list[dict]:
    """Every answer on the results topic once `want` have arrived (and `settle` seconds more, to catch extras)."""
    async def go():
        consumer = AIOKafkaConsumer(REMEDIATION.full(env["FLEETPULSE_TOPIC_PREFIX"]),
                                    bootstrap_servers=env["FLEETPULSE_KAFKA_BOOTSTRAP_SERVERS"],
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        out, deadline, until = [], time.monotonic() + timeout, None
        try:
            while time.monotonic() < (until or deadline):
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    out += [REMEDIATION.decode(r.value) for r in records]
                if len(out) >= want and until is None:
                    until = time.monotonic() + settle
        finally:
            await consumer.stop()
        return out

    return asyncio.run(go())


def answer(env: dict, e: DrainEvent, timeout: float = 60) -> dict:
    """The one answer to `e` (waiting for it); fails on none or on two."""
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in results(env, 0, timeout=1) if r["event_id"] == e.event_id]
        if got or time.monotonic() > deadline:
            break
    assert len(got) == 1, f"answers to {e.action} {e.event_id}: {got}"
    return got[0]


def test_a_sick_node_is_drained_after_its_job_rebooted_validated_and_returned(cluster, bot, bot_env):
    job = cluster.submit("n1", 300)
    bot()
    fault = {"repair": "reboot", "mode": "after_jobs", "code": "xid:79", "gpu_index": "3"}
    drain = event("n1", "drain", evidence=fault)
    publish(bot_env, [drain])
    cluster.wait_until(lambda: "DRAIN" in cluster.state("n1"), 30, "n1 drain-marked")
    assert cluster.state("n1") == "ALLOCATED+DRAIN", "its job runs on: DRAINING, not DRAINED"
    time.sleep(2)  # several of the bot's polls
    assert [r for r in results(bot_env, 0, timeout=1) if r["event_id"] == drain.event_id] == [], \
        "reported drained while its job was running"
    cluster.run("scancel", job)  # the job ends
    got = answer(bot_env, drain)
    assert got["ok"] and "drained (IDLE+DRAIN)" in got["detail"], got
    assert cluster.reason("n1").startswith(f"fleetpulse: reboot xid:79 gpu3 {drain.event_id}")

    repair = event("n1", "repair", evidence={"repair": "reboot", "mode": "after_jobs"})
    publish(bot_env, [repair])
    got = answer(bot_env, repair, timeout=90)
    assert got["ok"] and "rebooted" in got["detail"], got
    assert cluster.reboots().count("n1") == 1
    assert cluster.state("n1") == "DOWN", "back from its reboot, still out of service until validated"

    validate = event("n1", "validate", requirements={"dcgm_diag_level": 2, "nccl_busbw_min_gbs": 60})
    publish(bot_env, [validate])
    got = answer(bot_env, validate)
    assert got["ok"], got
    assert got["measurements"] == {"dcgm_diag_level": 2.0, "nccl_busbw_gbs": 70.742}
    assert Path(bot_env["CHECKS"]).read_text().splitlines() == ["dcgm r2 n1", "nccl n1"]

    undrain = event("n1", "undrain")
    publish(bot_env, [undrain])
    got = answer(bot_env, undrain)
    assert got["ok"], got
    assert cluster.state("n1") == "IDLE"
    cluster.submit("n1", 1)  # schedulable again
    answers = results(bot_env, 4, settle=1.0)
    assert sorted(a["event_id"] for a in answers) == sorted(e.event_id for e in (drain, repair, validate, undrain))


def test_a_validation_below_the_required_bandwidth_fails_and_the_node_stays_out(cluster, bot, bot_env):
    """And the bot's /metrics (FLEETPULSE_BOT_METRICS_PORT) counts it under the names every role uses."""
    cluster.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=fleetpulse: reset ev-old")
    port = free_ports(1)
    bot({**bot_env, "FLEETPULSE_BOT_METRICS_PORT": str(port), "FLEETPULSE_BOT_METRICS_ADDR": "127.0.0.1"})
    validate = event("n3", "validate", requirements={"dcgm_diag_level": 3, "nccl_busbw_min_gbs": 80})
    publish(bot_env, [validate])
    got = answer(bot_env, validate)
    assert not got["ok"] and ">= 80 required" in got["detail"], got
    assert got["measurements"] == {"dcgm_diag_level": 3.0, "nccl_busbw_gbs": 70.742}
    assert "DRAIN" in cluster.state("n3")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    for line in ('fleetpulse_bot_received_total{bot="slurm"} 1.0', 'fleetpulse_bot_refused_total{bot="slurm"} 0.0',
                 'fleetpulse_bot_emitted_total{action="validate",bot="slurm"} 1.0',
                 'fleetpulse_bot_errors_total{action="validate",bot="slurm"} 1.0',
                 'fleetpulse_bot_state_entries{bot="slurm"} 0.0'):
        assert line in text, (line, text)
    assert 'fleetpulse_bot_batch_seconds_count{action="validate",bot="slurm"} 1.0' in text
    assert 'fleetpulse_bot_lag_seconds{bot="slurm"}' in text


def test_a_node_drained_by_someone_else_is_never_touched_or_resumed(cluster, bot, bot_env):
    cluster.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=admin: bad fan, ticket 4411")
    bot()
    drain = event("n2", "drain", evidence={"repair": "reboot", "mode": "immediate"})
    repair = event("n2", "repair", evidence={"repair": "reboot"})
    undrain = event("n2", "undrain")
    ignored = [event("n9-not-in-this-cluster", "drain", evidence={"repair": "reset"}),  # another cluster's
               event("n[1-3]", "undrain"), event("-n3", "drain"),  # names that are no single node
               event("n3", "drain", evidence={"repair": "reset"}).model_copy(update={"ts": time.time() - 7200})]
    publish(bot_env, [drain, repair, undrain, *ignored])
    answers = results(bot_env, 3, settle=3.0)
    assert sorted(a["event_id"] for a in answers) == sorted(e.event_id for e in (drain, repair, undrain)), answers
    got = {a["action"]: a for a in answers}
    assert cluster.state("n3") == "IDLE" and cluster.state("n1") == "IDLE", "an ignored request acted"
    assert got["drain"]["ok"] and "not claimed" in got["drain"]["detail"]
    assert not got["repair"]["ok"] and "someone else" in got["repair"]["detail"]
    assert not got["undrain"]["ok"] and "admin: bad fan, ticket 4411" in got["undrain"]["detail"]
    assert cluster.state("n2") == "IDLE+DRAIN"
    assert cluster.reason("n2").startswith("admin: bad fan, ticket 4411")
    assert "n2" not in cluster.reboots()


def test_a_bot_killed_between_its_action_and_its_report_neither_repeats_nor_loses_it(cluster, bot, bot_env):
    job = cluster.submit("n3", 300)
    first = bot()
    drain = event("n3", "drain", evidence={"repair": "reset", "mode": "after_jobs"})
    publish(bot_env, [drain])
    cluster.wait_until(lambda: drain.event_id in cluster.reason("n3"), 30, "n3 drain-marked by the bot")
    first.kill()  # the job still runs: the drain is issued, not reported
    marked = cluster.log_count(f"reason set to: fleetpulse: reset {drain.event_id}")
    assert marked == 1
    publish(bot_env, [drain])  # and the request is delivered again
    bot()
    time.sleep(2)
    cluster.run("scancel", job)
    got = answer(bot_env, drain)
    assert got["ok"] and "drained" in got["detail"], got
    assert cluster.log_count(f"reason set to: fleetpulse: reset {drain.event_id}") == 1, "drain issued twice"
    assert len(results(bot_env, 1, settle=2.0)) == 1


def test_a_check_cut_off_by_a_restart_is_not_run_again_and_is_answered_failed(cluster, bot, bot_env):
    cluster.run("scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=fleetpulse: reset ev-old")
    checks = Path(bot_env["CHECKS"])
    slow = dict(json.loads(bot_env["FLEETPULSE_BOT_SLURM"]),
                dcgm_diag_command=["sh", "-c", f"echo started {{node}} >> {checks}; sleep 4"])
    env = {**bot_env, "FLEETPULSE_BOT_SLURM": json.dumps(slow)}
    first = bot(env)
    validate = event("n1", "validate", requirements={"dcgm_diag_level": 3})
    publish(env, [validate])
    SlurmCluster.wait_until(lambda: checks.exists() and "started" in checks.read_text(), 30, "the check started")
    first.kill()
    bot(env)
    got = answer(env, validate)
    assert not got["ok"] and "not run again" in got["detail"], got
    assert checks.read_text().count("started") == 1


def test_the_default_consumer_group_is_one_per_cluster(cluster, monkeypatch):
    from bots.settings import BotSettings
    from bots.slurm.config import SlurmBotConfig
    from bots.slurm.executor import SlurmExecutor

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    name = asyncio.run(SlurmExecutor(SlurmBotConfig()).cluster_id())
    assert BotSettings.group_id("slurm", name) == "fleetpulse-bot-slurm-fleetpulse-test"
