"""The stragglers faust stages: NCCL timings scored per job, re-keyed by host, joined with each GPU's condition."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import faust
from faust.types import TP, EventT
from pydantic import ValidationError

from core.errors import DecodeError
from schemas.analytics import StragglerScore
from schemas.codec import encode
from schemas.topics import NCCL, SAMPLES, STRAGGLERS, STRAGGLERS_BY_HOST
from streams.emit import refuse as refuse_record
from streams.emit import refuse_invalid
from streams.state import put
from streams.straggler_cause import CauseConfig, explain, material, update
from streams.straggler_windows import Batch, JobState
from streams.stragglers import Config, advance

if TYPE_CHECKING:
    from streams.context import StageContext

COMPONENT = "streams.stragglers"
CHECKPOINT_S = 10.0  # event-time seconds between checkpoints of a job's open window (0: every batch)
JOB_TTL_S = 1800.0  # wall seconds without timings after which a job's state is dropped (tombstoned)
SWEEP_S = 60.0
CATCH_UP_S = 5.0  # how long a batch of scores waits for its hosts' samples to reach the window end (replays)


def wire(app: faust.App, ctx: StageContext, config: Config = Config(), cause: CauseConfig = CauseConfig(), *,
         checkpoint_s: float = CHECKPOINT_S, job_ttl_s: float = JOB_TTL_S, sweep_s: float = SWEEP_S,
         catch_up_s: float = CATCH_UP_S) -> list:
    """Register the three stages (all concurrency 1) and their two tables on the app.

    - `stragglers` (fleet.telemetry.nccl, keyed by job): window sums per rank, robust z, K-of-N persistence; every
      score it publishes goes to the internal topic `<app id>-stragglers-by_host`, keyed by the rank's host.
    - `stragglers.gpus` (fleet.telemetry.samples, keyed by host): the compact latest condition of every GPU.
    - `stragglers.attribute` (the internal topic, co-partitioned with the samples): adds the GPU's throttle reasons
      and temperatures to each score and publishes it to fleet.stragglers, keyed by job.
    A job's state lives in memory between batches and reaches the changelog when a window closes or every
    checkpoint_s of event time: a crash or rebalance costs at most that span of one window's timings (the same
    span of every rank, so the window is still scored fairly).
    """
    s, m, log = ctx.settings, ctx.metrics, ctx.log
    raw = dict(key_serializer="raw", value_serializer="raw")
    nccl_name, by_host_name = NCCL.full(s.topic_prefix), STRAGGLERS_BY_HOST.full(app.conf.id)
    out_topic = STRAGGLERS.full(s.topic_prefix)
    jobs = app.Table("stragglers-jobs", partitions=NCCL.partitions, help="per-job window sums and K-of-N history")
    gpus = app.Table("stragglers-gpus", partitions=SAMPLES.partitions, help="per-host compact GPU condition")
    live: dict[str, list] = {}  # job -> [state, wall time last touched, partition]
    written: dict[str, dict] = {}  # host -> condition last written to the changelog
    swept = [time.monotonic()]

    async def refuse(pending: list[Awaitable], event: EventT, dlq: str, reason: str) -> None:
        await refuse_record(ctx, pending, event, dlq, reason, COMPONENT)

    def held(job: str) -> JobState | None:
        stored, mine = jobs.get(job), live.get(job)
        if mine is not None and mine[0].epoch == (stored or {}).get("epoch", ""):
            return mine[0]
        return JobState.from_json(stored) if stored else None  # another worker moved it on, or a restart

    def sweep() -> None:
        now = time.monotonic()
        if now - swept[0] < sweep_s:
            return
        swept[0] = now
        actives = app.assignor.assigned_actives()
        for job, (state, touched, partition) in list(live.items()):
            if now - touched >= job_ttl_s:
                del live[job]
                if (jobs.get(job) or {}).get("epoch") == state.epoch and TP(nccl_name, partition) in actives:
                    jobs.data.pop(job, None)
                    jobs.send_changelog(partition, job, None, value_serializer="raw")

    async def stragglers(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            m.received += len(events)
            pending: list[Awaitable] = []
            by_job: dict[str, list[tuple[EventT, dict]]] = {}
            for event in events:
                try:
                    rec = NCCL.decode(event.message.value)
                except DecodeError as exc:
                    refuse_invalid(ctx, event, str(exc))
                    continue
                by_job.setdefault(rec["job"], []).append((event, rec))
            checkpoints = []
            for job, items in by_job.items():
                partition = items[-1][0].message.partition
                prior = held(job)
                closed = None if prior is None else prior.closed
                try:
                    state, scores, (dups, late) = advance(prior, job, Batch.of([r for _, r in items]), config)
                except Exception as exc:  # noqa: BLE001 - refuse this job's records, reload its checkpoint later
                    live.pop(job, None)
                    for event, _ in items:
                        await refuse(pending, event, NCCL.dlq(s.topic_prefix), f"straggler scoring failed: {exc!r}")
                    continue
                if dups or late:
                    log.debug("%s: dropped %d duplicate and %d late timings", job, dups, late)
                for sc in scores:
                    pending.append(await ctx.emitter.send(by_host_name, (sc.host or f"job:{job}").encode(),
                                                          encode(sc)))
                live[job] = [state, time.monotonic(), partition]
                if state.closed != closed or state.wm - state.checkpoint_wm >= checkpoint_s:
                    checkpoints.append((job, state, partition))
            await asyncio.gather(*pending)  # candidates acknowledged before state is written and offsets commit
            for job, state, partition in checkpoints:
                state.epoch, state.checkpoint_wm = uuid.uuid4().hex[:12], state.wm
                put(jobs, partition, job, state.to_json())
            sweep()
            m.observe_batch(time.perf_counter() - started)

    async def conditions(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            pending: list[Awaitable] = []
            for event in events:
                try:
                    sample = SAMPLES.decode(event.message.value)
                except DecodeError as exc:
                    refuse_invalid(ctx, event, str(exc))
                    continue
                host = sample["host"]
                new = update(gpus.get(host), sample)
                if new is None:
                    continue  # a replayed or out-of-order sample
                if material(written.get(host), new, cause):
                    put(gpus, event.message.partition, host, new)
                    written[host] = new
                else:
                    gpus.data[host] = new  # fresh in memory; the changelog holds a materially equal condition
            await asyncio.gather(*pending)
            m.observe_batch(time.perf_counter() - started)

    async def caught_up(scores: list[StragglerScore]) -> None:
        """Give the co-partitioned samples a moment to pass the windows' ends: a replay reads both topics at once."""
        deadline = time.monotonic() + catch_up_s
        behind = [sc for sc in scores if (gpus.get(sc.host) or {}).get("ts", 0.0) < sc.window_end]
        while behind and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            behind = [sc for sc in behind if (gpus.get(sc.host) or {}).get("ts", 0.0) < sc.window_end]

    async def attribute(stream):
        async for events in stream.take_events(s.streams_batch_max, within=s.streams_batch_within_s):
            started = time.perf_counter()
            pending: list[Awaitable] = []
            scores = []
            for event in events:
                try:
                    scores.append(StragglerScore.model_validate_json(event.message.value))
                except ValidationError as exc:
                    await refuse(pending, event, NCCL.dlq(s.topic_prefix), f"bad straggler candidate: {exc}")
            await caught_up(scores)
            for sc in scores:
                why, numbers = explain(gpus.get(sc.host), sc.host, sc.gpu_index, sc.window_start, sc.window_end,
                                       cause)
                final = sc.model_copy(update={"reasons": sc.reasons[:1] + why + sc.reasons[1:],
                                              "evidence": {**sc.evidence, **numbers}})
                pending.append(await ctx.emitter.send(out_topic, sc.job.encode(), encode(final)))
                if not sc.flagged or sc.evidence.get("flagged_since") == sc.window_start:
                    log.info("%s %s rank %d (%s GPU %s): %s", "flagged" if sc.flagged else "cleared", sc.job,
                             sc.rank, sc.host, sc.gpu_index, "; ".join(final.reasons[:2]))
            await asyncio.gather(*pending)
            m.emitted += len(scores)
            m.observe_batch(time.perf_counter() - started)

    by_host = app.topic(by_host_name, internal=True, partitions=SAMPLES.partitions, replicas=s.streams_replication,
                        **raw)
    return [app.agent(app.topic(nccl_name, **raw), name="stragglers", concurrency=1)(stragglers),
            app.agent(app.topic(SAMPLES.full(s.topic_prefix), **raw), name="stragglers.gpus",
                      concurrency=1)(conditions),
            app.agent(by_host, name="stragglers.attribute", concurrency=1)(attribute)]
