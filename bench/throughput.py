"""Throughput on one data set: raw consume+decode (the ceiling), stream worker, sink, and a bare insert.

    python bench/throughput.py --hosts 200 --ticks 30 [--out bench/results/throughput.json]
    python bench/throughput.py --stages all --hosts 256 --ticks 60 --baseline /tmp/before  # whole worker

--stages all runs the whole worker on a simulated fleet (samples, XID, NCCL) and reports records/s per input
topic from the group's first commit until its lag is 0, beside the raw consume+decode ceiling of those topics;
--baseline runs another checkout's worker (`git archive <commit> | tar -x -C /tmp/before`) interleaved with it;
--workers N runs N telemetry worker processes in the one consumer group (scale-out: a share of the partitions each;
default: as `fleetpulse streams` runs them, one per core up to the samples topic's partitions), and the report gives
samples/s per core of worker CPU beside the bare consumer's (`samples_per_core_s_*`),
--baseline-workers M the baseline's (1 for a tree from before the stream runtime, which runs one). --warmup K rounds
(default 1) run first, unmeasured, each tree's: a fresh broker's JIT compiler takes ~0.3-0.6 of a core for the first
minute or more, which a scaled-out worker that fills both cores feels and a one-core consumer does not. Each run says
how many cores the broker used meanwhile (`broker_cores`, beside the ceiling's), when the bench started it.

Uses KAFKA_BOOTSTRAP_SERVERS when set, else starts the project's local broker in a temporary directory.
Every stage reads the same simulated samples under one fresh topic prefix; figures are medians over
--repeat runs where a stage is repeatable in-process (decode, bare insert), single runs otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from pydantic import SecretStr
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from agents.publisher import Publisher
from agents.simulator.simulate import FleetSimulator, simulate
from schemas.provision import ensure_topics
from fleetpulse.lag import OffsetWatch, per_topic, stable_members
from core.kafka_admin import delete_prefixed
from core.logs import quiet_transient_client_logs
from fleetpulse.broker import LocalKafka, broker_for
from fleetpulse.clickhouse_server import LocalClickHouse
from core.settings import CommonSettings
from schemas.json_intake import INTAKES, SETTINGS as INTAKE_FORMAT_SETTINGS
from schemas.tables import TABLES
from schemas.topics import NCCL, SAMPLES, XID, Topic
from core.clickhouse import connect
from sinks import store
from sinks.sink import ClickHouseSink
from sinks.settings import SinkSettings

from report import save  # bench/report.py, beside this script


async def publish(settings: CommonSettings, hosts: int, ticks: int) -> int:
    sim = FleetSimulator(hosts, seed=7, start_ts=time.time() - ticks, nccl_interval=0)
    await ensure_topics(settings.kafka_client_args(), prefix=settings.topic_prefix)
    n = 0
    async with Publisher(settings, client_id="bench") as pub:
        for _ in range(ticks):
            for s in sim.step().samples:
                await pub.send(SAMPLES, s)
                n += 1
        await pub.flush()
    return n


async def consume_raw(settings: CommonSettings, expected: int, topics: tuple[Topic, ...] = (SAMPLES,),
                      *, keep: bool = True) -> tuple[float, list, float]:
    """Seconds to fetch and orjson-decode every record of `topics` (the ceiling for any consumer of them), the records
    (`keep`; else none: a consumer that holds every record it read pays for it in garbage collection: ~1.3x at 30k
    samples), and the CPU seconds this process spent on it (it is otherwise idle meanwhile)."""
    consumer = AIOKafkaConsumer(**settings.kafka_client_args(), enable_auto_commit=False, max_poll_records=5000,
                                fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    tps = [TopicPartition(t.full(settings.topic_prefix), p) for t in topics for p in range(t.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    decoded, seen, t0, cpu0 = [], 0, time.perf_counter(), time.process_time()
    try:
        while seen < expected:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                got = [(tp.partition, r.offset, orjson.loads(r.value)) for r in records]
                seen += len(got)
                if keep:
                    decoded += got
        return time.perf_counter() - t0, decoded, time.process_time() - cpu0
    finally:
        await consumer.stop()


def local_broker_pid(tmp: Path) -> int | None:
    """The pid of the broker this bench started under `tmp` (None: KAFKA_BOOTSTRAP_SERVERS named another)."""
    try:
        return json.loads(LocalKafka(tmp / "data").pid_file.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc; none where it cannot be read)."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return []


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of one process so far (Linux /proc); NaN where it cannot be read or for no process
    (None: a broker this bench did not start)."""
    if pid is None:
        return math.nan
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def worker_topics(settings: CommonSettings, stages: str) -> dict[str, int]:
    """Input topics whose group lag says the worker caught up: samples alone, or every registry input."""
    chosen = [SAMPLES] if stages == "power_thermal" else [SAMPLES, NCCL, XID]
    return {t.full(settings.topic_prefix): t.partitions for t in chosen}


async def stream_worker(settings: CommonSettings, env: dict, topics: dict[str, int], *, stages: str = "power_thermal",
                        cwd: Path | None = None, profile: Path | None = None, commit_interval_s: float = 0.5,
                        workers: int = 1, logs: Path | None = None, broker_pid: int | None = None) -> dict:
    """Run `fleetpulse streams` (from `cwd`'s tree when given) until its group has committed every input record.

    Per topic: records left at the group's first commit / seconds from then until the topic's lag is 0. Progress is
    seen only when the worker commits, so the worker commits every `commit_interval_s` (both trees read the same
    setting): at faust's 2.8 s the last commit came up to 2.8 s after the work was done, a large share of a worker
    run of ~10 s and a small one of the baseline's ~60 s.

    `workers` > 1: as many telemetry worker processes in the one consumer group (the first also starts the decisions
    worker, as `fleetpulse streams` does), each taking a share of the partitions; timed from the first commit after
    every one of them is a member of the settled group, so the first one's head start and the rebalances as the others
    join are left out. CPU is the telemetry processes' together. `logs`: each process's output to `logs`.w<k>.log.
    `broker_pid`: the local broker's process, whose cores over the same span are reported beside the workers' and
    those of the processes they started (the decisions worker): all share the machine's cores.
    """
    from streams.groups import app_id

    env = {**env, "FLEETPULSE_STAGES": "" if stages == "all" else stages,
           "FLEETPULSE_STREAMS_COMMIT_INTERVAL_S": str(commit_interval_s)}
    procs = []
    for k in range(workers):
        cmd = [sys.executable, "-m", "fleetpulse.cli", "streams"]
        if k:  # one decisions worker is enough; each process a faust data directory of its own
            cmd += ["--worker", "telemetry", "--workdir", str(Path(env["FLEETPULSE_DATA_DIR"]) / f"streams-{k}")]
        if profile is not None:
            cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-o",
                   str(profile.with_suffix(f".w{k}.json") if k else profile), "--format", "speedscope", "--rate", "50",
                   "--", *cmd]
        out = subprocess.DEVNULL if logs is None else open(logs.with_name(f"{logs.name}.w{k}.log"), "wb")
        procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT))
        if logs is not None:
            out.close()  # the child holds its own copy

    def cpu() -> float:  # the telemetry workers' own processes (with py-spy: py-spy's)
        return sum(cpu_seconds(p.pid) for p in procs)

    def others() -> float:  # the processes they started: the decisions worker (with py-spy: the workers)
        return sum(cpu_seconds(c) for p in procs for c in child_pids(p.pid))

    watch = OffsetWatch(settings.kafka_client_args(), topics)
    await watch.start()
    group = app_id(settings.topic_prefix)
    ends = per_topic(await watch.end_offsets())
    left, first, caught, settled = dict(ends), None, {}, None  # settled: what was left when the group settled
    started = time.perf_counter()
    try:
        while True:
            try:
                committed = await watch.admin.list_consumer_group_offsets(group)
                stable = workers == 1 or settled is not None or await stable_members(watch.admin, group) == workers
            except KafkaError:
                committed, stable = {}, False
            now = time.perf_counter()
            left = dict(ends)
            for tp, meta in committed.items():
                if tp.topic in left and meta.offset > 0:
                    left[tp.topic] -= meta.offset
            if settled is None and stable:
                settled = sum(ends.values()) if workers == 1 else sum(left.values())
            if first is None and settled is not None and sum(left.values()) < settled:  # a commit after it settled
                first = (now, dict(left), cpu(), others(), cpu_seconds(broker_pid))
            caught.update((t, now) for t, n in left.items() if n == 0 and t not in caught)
            if len(caught) == len(ends) and first is not None:
                used, others_used = cpu() - first[2], others() - first[3]
                broker_used = cpu_seconds(broker_pid) - first[4]
            if (len(caught) == len(ends) or now - started > 900 or any(p.poll() is not None for p in procs)):
                break
            await asyncio.sleep(0.2)
    finally:
        await watch.close()
        for proc in procs:
            proc.send_signal(signal.SIGINT if profile is not None else signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
    exits = [p.returncode for p in procs if p.returncode not in (None, 0, -signal.SIGTERM, -signal.SIGINT)]
    if exits:
        return {"error": f"worker processes exited with {exits} (run `fleetpulse streams` by hand to see why)"}
    if first is None:
        return {"error": f"the group never had {workers} members before the worker caught up: fewer records than "
                         "one process needs to settle (more --ticks)"}
    if len(caught) < len(ends):
        return {"error": f"worker still {left} behind after {time.perf_counter() - started:.0f} s"}
    rates = {}
    for topic, n in first[1].items():
        name = topic.removeprefix(settings.topic_prefix)
        rates[name] = {"records": ends[topic], "after_first_commit": n,
                       "per_s": round(n / max(caught[topic] - first[0], 1e-9)) if n else None}
    seconds = max(caught.values()) - first[0]
    out = {"startup_s": round(first[0] - started, 2), "seconds": round(seconds, 2), "cpu_s": round(used, 2),
           "workers": workers, "topics": rates, "other_worker_cores": round(others_used / max(seconds, 1e-9), 2)}
    if broker_pid:
        out["broker_cores"] = round(broker_used / max(seconds, 1e-9), 2)
    return out



async def sink(settings: CommonSettings, expected_rows: int, json_intake: bool, run: str) -> dict:
    """The sink storing every sample of the topic into a database of its own, as a consumer group of its own: rows/s
    from its first record to its last row."""
    database = f"bench_sink_{run}_{uuid.uuid4().hex[:8]}"
    s = SinkSettings(**{**settings.model_dump(), "clickhouse_database": database},
                     sink_tables=["gpu_samples"], sink_http=False, sink_json_intake=json_intake,
                     sink_group_id=f"bench-sink-{run}")
    sk = ClickHouseSink(s)
    await sk.open_store()
    stop = asyncio.Event()
    stats = sk.stats.tables["gpu_samples"]
    t0 = time.perf_counter()
    task = asyncio.create_task(sk.run(stop))
    while stats.records == 0 and not task.done():  # group join and assignment are start-up, not throughput
        await asyncio.sleep(0.01)
    t1 = time.perf_counter()
    while stats.rows < expected_rows and not task.done():
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t1
    stop.set()
    await task
    await asyncio.to_thread(connect(settings, "owner").command, f"DROP DATABASE IF EXISTS {database}")
    return {"rows": stats.rows, "startup_s": round(t1 - t0, 2), "seconds": round(elapsed, 3),
            "rows_per_s": round(expected_rows / elapsed), "batches": stats.batches}


def kafka_engine(settings: CommonSettings, expected_rows: int, broker: str) -> dict:
    """ClickHouse's own Kafka table engine ingesting the same topic into the same tables (gpu_samples with its rollups):
    a Kafka table of the samples' JSON and a materialized view computing every stored column the way the sink's
    intake does (schemas/json_intake.py), the provenance from the engine's virtual columns. Rows/s from the first row
    stored to the last. A ClickHouse server only (FLEETPULSE_CLICKHOUSE_URL=http://…)."""
    if settings.embedded_store:
        return {"not_run": "needs a ClickHouse server (FLEETPULSE_CLICKHOUSE_URL=http://...): the embedded engine "
                           "refuses CREATE TABLE ... ENGINE = Kafka (chdb 4.4: Code 49, Shutdown was called)"}
    database = f"bench_kafka_engine_{uuid.uuid4().hex[:8]}"  # nothing stored before counts
    cfg = settings.model_copy(update={"clickhouse_database": database})
    store.prepare(cfg)
    client = connect(cfg, "owner")
    intake = INTAKES["gpu_samples"]
    topic = SAMPLES.full(settings.topic_prefix)
    try:
        client.command(
            f"CREATE TABLE samples_kafka ({intake.structure(provenance=False)}) ENGINE = Kafka SETTINGS "
            f"kafka_broker_list = '{broker}', kafka_topic_list = '{topic}', "
            f"kafka_group_name = 'bench-{uuid.uuid4().hex}', kafka_format = 'JSONEachRow', "
            f"kafka_num_consumers = {min(SAMPLES.partitions, os.cpu_count() or 1)}, "
            + ", ".join(f"{k} = {v}" for k, v in INTAKE_FORMAT_SETTINGS.items()))
    except Exception as exc:  # the local server (clickhouse-local's engine) refuses it too: Code 49
        client.command(f"DROP DATABASE IF EXISTS {database}")
        return {"not_run": f"the server refused ENGINE = Kafka: {str(exc)[:300]}"}
    t0, first = time.perf_counter(), None
    select = intake.query("samples_kafka", partition="_partition", offset="_offset",
                          kafka_ts_ms="toUnixTimestamp64Milli(_timestamp_ms)")
    client.command(f"CREATE MATERIALIZED VIEW samples_kafka_mv TO gpu_samples ({intake.columns}) AS {select}")
    try:
        stored, deadline = 0, time.monotonic() + 600
        while stored < expected_rows and time.monotonic() < deadline:
            stored = client.command("SELECT count() FROM gpu_samples")
            if stored and first is None:
                first = time.perf_counter()
            time.sleep(0.05)
        elapsed = time.perf_counter() - (first or t0)
    finally:
        client.command("DROP VIEW IF EXISTS samples_kafka_mv")
        client.command("DROP TABLE IF EXISTS samples_kafka")
        client.command(f"DROP DATABASE IF EXISTS {database}")
    return {"rows": stored, "startup_s": round((first or t0) - t0, 2), "seconds": round(elapsed, 3),
            "rows_per_s": round(stored / elapsed) if stored >= expected_rows else None}


def bare_insert(settings: CommonSettings, rows: list[tuple], batch_rows: int, repeat: int) -> dict:
    """clickhouse-connect inserting the rows already extracted, nothing else: what the store takes at most."""
    store.prepare(settings)
    client = connect(settings, "owner")
    table = TABLES["gpu_samples"]
    times = []
    for _ in range(repeat):
        client.command("TRUNCATE TABLE gpu_samples")
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch_rows):
            client.insert(table.name, rows[i:i + batch_rows], column_names=table.column_names,
                          settings={**store.INSERT_SETTINGS, "insert_deduplication_token": uuid.uuid4().hex})
        times.append(time.perf_counter() - t0)
    client.command(f"DROP DATABASE IF EXISTS {settings.clickhouse_database}")
    med = statistics.median(times)
    return {"rows_per_s": round(len(rows) / med), "seconds_median": round(med, 3), "repeat": repeat}


def namespace(tmp: Path) -> dict:
    """A fresh topic prefix (so a fresh consumer group and changelogs) with its data directories, as env vars; an
    embedded store of its own unless FLEETPULSE_CLICKHOUSE_URL names a server (where the Kafka-engine peer runs)."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    server = os.environ.get("FLEETPULSE_CLICKHOUSE_URL", "")
    url = server if server.startswith(("http://", "https://")) else f"chdb://{tmp / prefix / 'chdb'}"
    return {**os.environ, "FLEETPULSE_TOPIC_PREFIX": prefix, "FLEETPULSE_DATA_DIR": str(tmp / prefix / "data"),
            "FLEETPULSE_CLICKHOUSE_URL": url}


def baseline_nccl(args) -> str:
    """The NCCL form the --baseline tree reads: as given, or (auto) steps where it defines NcclStep."""
    if args.baseline_nccl != "auto":
        return args.baseline_nccl
    events = args.baseline / "schemas" / "events.py"
    return "steps" if events.exists() and "class NcclStep" in events.read_text() else "per_rank"


def workers_of(args, tree: str) -> int:
    """Worker processes of a tree: --workers, or --baseline-workers for the baseline (a tree from before
    --telemetry-processes runs one)."""
    return args.baseline_workers if tree == "before" and args.baseline_workers else args.workers


async def worker_runs(args, tmp: Path) -> dict:
    """The worker on a simulated fleet (samples, XID, NCCL), this tree and --baseline's side by side, interleaved.

    Each run gets a fresh namespace and its own published copy of the same fleet (seed 7); publishing is not timed.
    """
    trees = {"after": None} if args.baseline is None else {"before": args.baseline, "after": None}
    inputs = (SAMPLES, NCCL, XID) if args.stages == "all" else (SAMPLES,)
    runs: dict[str, list] = {name: [] for name in trees}
    ceiling: dict[str, list] = {name: [] for name in trees}
    broker_pid = local_broker_pid(tmp)
    rounds = [("warm-up", name) for name in trees for _ in range(args.warmup)]
    rounds += [(k, name) for k in range(args.repeat) for name in (list(trees) if k % 2 == 0 else list(trees)[::-1])]
    for k, name in rounds:
        env = namespace(tmp)
        os.environ.update(env)
        settings = CommonSettings()
        # The baseline worker reads NCCL as the per-rank records it was written for; NCCL rates below are rank
        # timings per second either way (records/s x timings per record), so the two trees compare.
        per_rank = name == "before" and baseline_nccl(args) == "per_rank"
        report = await simulate(settings, hosts=args.hosts, duration=args.ticks, speed=0, seed=7,
                                start_ts=time.time() - args.ticks, nccl_interval=args.nccl_interval,
                                per_rank_nccl=per_rank)
        unit = {t.name: 1.0 for t in inputs}
        if NCCL in inputs and report.sent.get(NCCL.name):
            unit[NCCL.name] = report.nccl_timings / report.sent[NCCL.name]
        n = sum(report.sent[t.name] for t in inputs)
        # the ceiling of this very publication
        broker_cpu = cpu_seconds(broker_pid)
        seconds, _, cpu_s = await consume_raw(settings, n, inputs, keep=False)
        ceiling[name].append({t.name: report.sent[t.name] * unit[t.name] / seconds for t in inputs})
        ceiling[name][-1]["cpu_us_per_sample"] = 1e6 * cpu_s / report.sent[SAMPLES.name]
        # the cores each side of the ceiling's consume took: the broker shares this machine with its consumers
        run_ceiling = {"consumer_cores": round(cpu_s / seconds, 2)}
        if broker_pid:
            run_ceiling["broker_cores"] = round((cpu_seconds(broker_pid) - broker_cpu) / seconds, 2)
        profile = args.profile.with_suffix(f".{name}.{k}.json") if args.profile else None
        run = await stream_worker(settings, env, worker_topics(settings, args.stages), stages=args.stages,
                                  cwd=trees[name], profile=profile, commit_interval_s=args.commit_interval,
                                  workers=workers_of(args, name), broker_pid=broker_pid,
                                  logs=args.worker_logs and args.worker_logs / f"{name}.{k}")
        # CPU per host sample with its share of NCCL: robust to what the machine gave the run
        if "cpu_s" in run and run["topics"][SAMPLES.name]["after_first_commit"]:
            samples = run["topics"][SAMPLES.name]["after_first_commit"]
            run["cpu_us_per_sample"] = round(1e6 * run["cpu_s"] / samples, 1)
        for topic, rate in run.get("topics", {}).items():
            rate["records_per_timing"] = round(1.0 / unit.get(topic, 1.0), 4)
            rate["per_s"] = round(rate["per_s"] * unit.get(topic, 1.0)) if rate["per_s"] else None
            if rate["per_s"] and ceiling[name][-1].get(topic):  # against this run's own ceiling: the machine
                rate["vs_ceiling"] = round(rate["per_s"] / ceiling[name][-1][topic], 3)  # as both met it
        run["ceiling"] = run_ceiling
        print(name, k, json.dumps(run), file=sys.stderr)
        if k == "warm-up":  # the broker's JIT still compiles its hot paths (~0.4 of a core): not measured
            ceiling[name].pop()
        else:
            runs[name].append(run)
        # ~50 topics of 8 partitions a run: left behind, the 4th run's publishing met NotLeaderForPartition for
        # ~110 s on this machine's broker
        await delete_prefixed(settings.kafka_client_args(), settings.topic_prefix)

    def median(rs: list[dict], topic: str) -> float | None:
        vals = [r["topics"][topic]["per_s"] for r in rs if "topics" in r and r["topics"][topic]["per_s"]]
        return round(statistics.median(vals)) if vals else None

    out = {"data": {"hosts": args.hosts, "ticks": args.ticks, "nccl_interval": args.nccl_interval,
                    "sent": report.sent, "nccl_timings": report.nccl_timings, "stages": args.stages,
                    "workers": args.workers, "baseline_workers": workers_of(args, "before") if args.baseline else None,
                    "units": "samples/s; NCCL: rank timings/s",
                    "baseline_nccl": baseline_nccl(args) if args.baseline is not None else None}}
    for name, rs in runs.items():
        out[f"raw_consume_decode_{name}"] = {t.name: round(statistics.median(c[t.name] for c in ceiling[name]))
                                              for t in inputs}
        out[f"stream_worker_{name}"] = {"per_s_median": {t.name: median(rs, t.name) for t in inputs}, "runs": rs}
        out[f"worker_vs_ceiling_{name}"] = {t.name: round(median(rs, t.name) / out[f"raw_consume_decode_{name}"][
            t.name], 3) for t in inputs if median(rs, t.name)}
        # Each run against the ceiling measured just before it, then the median: on a shared machine whose speed moves
        # by 1.5x run to run (CPU per sample 275-420 us in three like runs), the fairer of the two.
        paired = {t.name: [r["topics"][t.name]["vs_ceiling"] for r in rs
                           if "topics" in r and "vs_ceiling" in r["topics"][t.name]] for t in inputs}
        out[f"worker_vs_own_ceiling_{name}"] = {topic: round(statistics.median(v), 3) for topic, v in paired.items()
                                                if v}
        # The same comparison in CPU: a bare consumer's CPU per sample over the worker's (both read samples and NCCL).
        cpu = [r["cpu_us_per_sample"] for r in rs  # none (no sample left at the first commit) or NaN: not counted
               if r.get("cpu_us_per_sample", math.nan) == r.get("cpu_us_per_sample", math.nan)]
        ceiling_cpu = statistics.median(c["cpu_us_per_sample"] for c in ceiling[name])
        out[f"cpu_us_per_sample_{name}"] = {"worker": round(statistics.median(cpu), 1) if cpu else None,
                                            "raw_consume_decode": round(ceiling_cpu, 1)}
        if cpu:
            out[f"worker_vs_ceiling_cpu_{name}"] = round(ceiling_cpu / statistics.median(cpu), 3)
            # the product's measure: the fleet one core holds, host samples per second per core of worker CPU
            out[f"samples_per_core_s_{name}"] = {"worker": round(1e6 / statistics.median(cpu)),
                                                 "raw_consume_decode": round(1e6 / ceiling_cpu)}
        # Where the machine's cores went, medians over the runs: a worker that fills the cores shares them with the
        # broker and the decisions worker; the ceiling's one consumer leaves the broker a core of its own.
        done = [r for r in rs if "seconds" in r]
        out[f"cores_{name}"] = {
            "workers": _median([r["cpu_s"] / max(r["seconds"], 1e-9) for r in done]),
            "other_workers": _median([r["other_worker_cores"] for r in done]),
            "broker": _median([r["broker_cores"] for r in done if "broker_cores" in r]),
            "ceiling_consumer": _median([r["ceiling"]["consumer_cores"] for r in rs]),
            "ceiling_broker": _median([r["ceiling"]["broker_cores"] for r in rs if "broker_cores" in r["ceiling"]])}
    if "before" in runs:
        out["ratio_after_vs_before"] = {
            t.name: round(median(runs["after"], t.name) / median(runs["before"], t.name), 2)
            for t in inputs if median(runs["after"], t.name) and median(runs["before"], t.name)}
        before, after = out["cpu_us_per_sample_before"]["worker"], out["cpu_us_per_sample_after"]["worker"]
        if before and after:
            out["cpu_ratio_before_vs_after"] = round(before / after, 2)  # x less CPU per sample
    return out


async def main(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="fleetpulse-bench-"))
    async with broker_for(tmp / "data", port=39092):
        if args.stages == "all" or args.baseline is not None:
            return await worker_runs(args, tmp)
        return await pipeline(args, tmp)


async def pipeline(args, tmp: Path) -> dict:
    """Samples only: raw decode ceiling, the power_thermal worker, the ClickHouse sink into each store (the local server
    and the embedded engine, alternated run by run on the same records) and a bare insert into each."""
    env = namespace(tmp)
    os.environ.update(env)
    settings = CommonSettings()
    n = await publish(settings, args.hosts, args.ticks)
    decode_times = []
    for _ in range(args.repeat):
        seconds, decoded, _ = await consume_raw(settings, n)
        decode_times.append(seconds)
    rows = [r for part, off, rec in decoded for r in TABLES["gpu_samples"].rows(rec, part, off)]
    raw_s = statistics.median(decode_times)
    worker = (await stream_worker(settings, env, worker_topics(settings, "power_thermal"))
              if not args.skip_streams else None)
    server = None
    try:
        stores = {}
        for name in args.stores.split(","):
            if name == "server":
                server, stores[name] = server_store(settings, tmp)
            elif name == "embedded":  # the process's one embedded store (namespace's, unless a server was named)
                stores[name] = settings if settings.embedded_store else settings.model_copy(
                    update={"clickhouse_url": f"chdb://{tmp / 'chdb'}"})
            else:
                raise SystemExit(f"--stores: server or embedded, not {name!r}")
        ways = ("json_intake", "python_rows") if args.python_rows else ("json_intake",)
        runs: dict[str, list[dict]] = {f"{store}/{way}": [] for store in stores for way in ways}
        for k in range(args.repeat):  # alternated, each run a fresh database and consumer group on the same records
            for store_name, store_settings in stores.items():
                for way in ways:
                    runs[f"{store_name}/{way}"].append(await sink(store_settings, len(rows), way == "json_intake",
                                                                  f"{store_name}_{way}_{k}"))
        sink_rates = {key: statistics.median(r["rows_per_s"] for r in rs) for key, rs in runs.items()}
        bare = {}
        for store_name, store_settings in stores.items():
            bare_settings = store_settings.model_copy(
                update={"clickhouse_database": f"bench_bare_{uuid.uuid4().hex[:8]}"})
            bare[store_name] = await asyncio.to_thread(bare_insert, bare_settings, rows, 50_000, args.repeat)
        peer = (await asyncio.to_thread(kafka_engine, stores["server"], len(rows),
                                        args.kafka_engine_broker or settings.bootstrap)
                if "server" in stores else {"not_run": "no server among --stores"})
    finally:
        if server is not None:
            server.stop()
    t0 = time.perf_counter()
    for part, off, rec in decoded:
        TABLES["gpu_samples"].rows(rec, part, off)
    rows_s = time.perf_counter() - t0
    raw_rows_per_s = len(rows) / raw_s
    ratios = {}
    for store_name in stores:
        rate = sink_rates[f"{store_name}/json_intake"]
        ratios[f"{store_name}_sink_vs_bare_insert"] = round(rate / bare[store_name]["rows_per_s"], 3)
        ratios[f"{store_name}_sink_vs_raw_decode"] = round(rate / raw_rows_per_s, 3)
        if args.python_rows:
            ratios[f"{store_name}_json_intake_vs_python_rows"] = round(
                rate / sink_rates[f"{store_name}/python_rows"], 3)
    if {"server", "embedded"} <= set(stores):
        ratios["sink_server_vs_embedded"] = round(sink_rates["server/json_intake"]
                                                  / sink_rates["embedded/json_intake"], 3)
    if peer.get("rows_per_s"):
        ratios["server_sink_vs_kafka_engine"] = round(sink_rates["server/json_intake"] / peer["rows_per_s"], 3)
    return {
        "data": {"hosts": args.hosts, "ticks": args.ticks, "samples": n, "gpu_rows": len(rows),
                 "mean_sample_bytes": round(sum(len(orjson.dumps(r)) for _, _, r in decoded[:200]) / min(200, n))},
        "raw_consume_decode": {"samples_per_s": round(n / raw_s), "rows_per_s": round(raw_rows_per_s),
                               "seconds_median": round(raw_s, 3), "repeat": args.repeat},
        "sink_row_extraction": {"rows_per_s": round(len(rows) / rows_s), "seconds": round(rows_s, 3)},
        "stream_worker": worker,
        "sink": {"rows_per_s_median": sink_rates, "runs": runs},
        "bare_clickhouse_insert": bare,
        "kafka_engine": peer,
        "ratios": ratios,
    }


def server_store(settings: CommonSettings, tmp: Path):
    """(the server, settings that store into it): the server FLEETPULSE_CLICKHOUSE_URL names, or the project's local
    server started here under `tmp` on free ports (stopped by the caller)."""
    if os.environ.get("FLEETPULSE_CLICKHOUSE_URL", "").startswith(("http://", "https://")):
        return None, settings.model_copy(update={"clickhouse_url": os.environ["FLEETPULSE_CLICKHOUSE_URL"]})
    http = _free_port()
    server = LocalClickHouse(tmp / "clickhouse", http_port=http, tcp_port=_free_port())
    server.start()
    roles = {f"clickhouse_{role}_{what}": (user if what == "user" else SecretStr(server.password(role)))
             for role, (user, _) in server.users.items() for what in ("user", "password")}
    return server, settings.model_copy(update={"clickhouse_url": server.url, **roles})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=200)
    p.add_argument("--ticks", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip-streams", action="store_true")
    p.add_argument("--stores", default="server,embedded",
                   help="the stores the sink writes into, alternated run by run (default: %(default)s: the local "
                        "ClickHouse server started here, or the one FLEETPULSE_CLICKHOUSE_URL names, and embedded chdb)")
    p.add_argument("--python-rows", action="store_true",
                   help="also the sink with FLEETPULSE_SINK_JSON_INTAKE=false (rows extracted by Python)")
    p.add_argument("--kafka-engine-broker", help="the broker as the ClickHouse server reaches it (default: as here)")
    p.add_argument("--stages", choices=("power_thermal", "all"), default="power_thermal",
                   help="all: the whole worker on samples, XID and NCCL from the simulator (no sink figures)")
    p.add_argument("--nccl-interval", type=float, default=1.0, help="simulated seconds between collectives")
    p.add_argument("--baseline", type=Path, help="another checkout (git archive of a commit) to run side by side")
    p.add_argument("--baseline-nccl", choices=("auto", "per_rank", "steps"), default="auto",
                   help="the NCCL wire form published for --baseline: per_rank for trees before the NcclStep form; "
                        "auto: steps if the tree's schemas/events.py defines NcclStep (per-rank records are 8x as "
                        "many: a tree that reads steps, fed them, looks half as fast)")
    p.add_argument("--commit-interval", type=float, default=0.5,
                   help="the worker's offset commit interval, seconds (progress is seen at commits; faust's is 2.8)")
    p.add_argument("--workers", type=int, default=None,
                   help="telemetry worker processes in the one group, each taking a share of the partitions (default: "
                        "as `fleetpulse streams` runs them, one per core up to the samples topic's partitions)")
    p.add_argument("--baseline-workers", type=int, help="the --baseline tree's worker processes (default: --workers; 1 "
                   "for a tree whose `fleetpulse streams` has no --worker)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds of each tree before the measured ones "
                   "(--stages all): a fresh broker's JIT compiles its hot paths for a minute or more, on the cores "
                   "the workers need")
    p.add_argument("--profile", type=Path, help="py-spy speedscope profile of each worker run, at "
                   "PATH.<tree>.<k>.json (with --workers: PATH.<tree>.<k>.w<n>.json for the n-th extra process)")
    p.add_argument("--worker-logs", type=Path, help="a folder for each worker process's log, <tree>.<k>.w<n>.log")
    p.add_argument("--out", type=Path, default=Path("bench/results/throughput.json"))
    a = p.parse_args()
    if a.worker_logs:
        a.worker_logs.mkdir(parents=True, exist_ok=True)
    if a.workers is None:
        from streams.settings import streams_settings, telemetry_processes

        a.workers = telemetry_processes(streams_settings())
    if a.workers < 1 or (a.baseline_workers is not None and a.baseline_workers < 1):
        p.error("--workers and --baseline-workers must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be 0 or more")
    quiet_transient_client_logs()
    save(asyncio.run(main(a)), a.out)
