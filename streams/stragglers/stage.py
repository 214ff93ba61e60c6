"""The stragglers stage: NCCL step timings scored per job, then each score joined with its GPU's condition.

Two steps of one stage, pure and in event time:

- `score` (lane `nccl`, fleet.telemetry.nccl keyed by job): window sums per rank, robust z, K-of-N persistence
  (streams/stragglers/scoring.py); every score it publishes goes to the internal topic stragglers-by_host, keyed by
  the rank's host. A job's state stays in memory between batches and reaches the changelog when a window closes or
  every `checkpoint_s` of event time: a crash costs at most that span of one window's timings (the same span of every
  rank, so the window is still scored fairly). A job whose newest timing is `job_ttl_s` older than the newest timing
  of a batch holding records of its partition is dropped (a tombstone on that changelog partition).
- `attribute` (lane `telemetry`, host samples and stragglers-by_host, both keyed by host): keeps each host's compact
  GPU condition (streams/stragglers/cause.py) and adds the GPU's throttle reasons and temperatures to each score,
  published to fleet.stragglers keyed by job. A score whose host's newest sample is more than `fresh_s` before the
  window's end (a replay reads both topics at once) is held, durably, until the host's samples get there, or until
  the step's samples are `catch_up_s` past the window's end (a host that stopped reporting: its last condition then
  explains the score).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from schemas.codec import encode
from schemas.topics import NCCL, SAMPLES, STRAGGLERS, STRAGGLERS_BY_HOST
from streams.runtime.spec import Emit, Input, Record, Setting, StageSpec, StateTable, State, Step
from streams.stragglers.cause import CauseConfig, explain, material, update
from streams.stragglers.scoring import ScoringConfig, advance
from streams.stragglers.windows import Batch, JobState

JOBS, GPUS, HELD = "jobs", "gpus", "held"


@dataclass(frozen=True)
class StragglerStageConfig:
    """The scoring method (ScoringConfig), the cause rules (CauseConfig) and how the stage keeps its state."""

    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    cause: CauseConfig = field(default_factory=CauseConfig)
    checkpoint_s: float = 10.0  # event-time seconds between checkpoints of a job's open window (0: every batch)
    job_ttl_s: float = 1800.0  # a job without timings for this long (event time) is dropped
    fresh_s: float = 30.0  # a host condition this close before a window's end explains it (a sample interval)
    catch_up_s: float = 5.0  # how far past a window's end samples go before a held score is published anyway


SETTING = Setting("stragglers", ScoringConfig, "straggler scoring: windows, thresholds, K-of-N persistence")


def stage_config(settings: object | None) -> StragglerStageConfig:
    return StragglerStageConfig(scoring=SETTING.of(settings))


def check_candidate(value: object) -> dict:
    """A score on stragglers-by_host: a StragglerScore, checked by fleet.stragglers' validator."""
    return STRAGGLERS.check(value)


def score_step(records: Sequence[Record], state: State, cfg: StragglerStageConfig) -> list[Emit]:
    by_job: dict[str, list[Record]] = {}
    for r in records:
        by_job.setdefault(r.value["job"], []).append(r)
    out: list[Emit] = []
    newest = 0.0
    for job, recs in by_job.items():
        prior = state.get(JOBS, job)
        closed = None if prior is None else prior.closed
        st, scores, (dups, late) = advance(prior, job, Batch.of([r.value for r in recs]), cfg.scoring)
        if dups or late:
            logging.getLogger("fleetpulse.streams.stragglers").debug(
                "%s: dropped %d duplicate and %d late timings", job, dups, late)
        out += [Emit(STRAGGLERS_BY_HOST, (sc.host or f"job:{job}").encode(), encode(sc)) for sc in scores]
        st.partition = recs[-1].partition
        checkpoint = st.closed != closed or st.wm - st.checkpoint_wm >= cfg.checkpoint_s
        if checkpoint:
            st.checkpoint_wm = st.wm
        state.put(JOBS, job, st, durable=checkpoint)
        newest = max(newest, st.wm)
    # Jobs that stopped: forgotten once the others moved on. Only on partitions this batch came from, which this
    # worker owns now: a key left in memory from a partition since reassigned must not tombstone its new owner's.
    owned = {r.partition for r in records}
    for job, st in state.scan(JOBS).items():
        if newest - st.wm >= cfg.job_ttl_s and st.partition in owned:
            state.delete(JOBS, job, partition=st.partition)
    return out


def _publish(sc: dict, cond: dict | None, cfg: CauseConfig) -> Emit:
    why, numbers = explain(cond, sc["host"], sc.get("gpu_index"), sc["window_start"], sc["window_end"], cfg)
    final = {**sc, "reasons": sc["reasons"][:1] + why + sc["reasons"][1:], "evidence": {**sc["evidence"], **numbers}}
    shown = not sc["flagged"] or sc["evidence"].get("flagged_since") == sc["window_start"]
    line = (f"{'flagged' if sc['flagged'] else 'cleared'} {sc['job']} rank {sc['rank']} ({sc['host']} GPU "
            f"{sc.get('gpu_index')}): {'; '.join(final['reasons'][:2])}") if shown else None
    return Emit(STRAGGLERS, sc["job"].encode(), orjson.dumps(final), line)


def attribute_step(records: Sequence[Record], state: State, cfg: StragglerStageConfig) -> list[Emit]:
    """Samples keep each host's condition; scores are published with it once the host's samples reach the window's
    end, held (table `held`, keyed by host) until then. The step's clock (newest sample seen) is kept in memory only:
    after a restart a silent host's held scores wait for the next samples."""
    out: list[Emit] = []
    conds: dict[str, dict | None] = {}
    written: dict[str, dict] = state.memo.setdefault("written", {})  # host -> condition last on the changelog
    held: dict[str, dict] = {}  # host -> {"p": partition, "scores": [...]}, as loaded and changed in this batch
    clock = state.memo.get("clock", 0.0)

    def cond_of(host: str) -> dict | None:
        if host not in conds:
            conds[host] = state.get(GPUS, host)
        return conds[host]

    def held_of(host: str) -> dict:
        if host not in held:
            stored = state.get(HELD, host)
            held[host] = {"p": stored["p"], "scores": list(stored["scores"])} if stored else {"p": None, "scores": []}
        return held[host]

    def release(host: str, ends_by: float) -> None:
        """Publish the host's held scores of windows that end by `ends_by`."""
        waiting = held_of(host)
        due = [sc for sc in waiting["scores"] if sc["window_end"] <= ends_by]
        if due:
            waiting["scores"] = [sc for sc in waiting["scores"] if sc["window_end"] > ends_by]
            out.extend(_publish(sc, cond_of(host), cfg.cause) for sc in due)

    for r in records:
        rec = r.value
        host = rec["host"]
        if r.kind == "sample":
            new = update(cond_of(host), rec)
            if new is None:
                continue  # a replayed or out-of-order sample
            conds[host] = new
            durable = material(written.get(host), new, cfg.cause)  # else the changelog holds a materially equal one
            state.put(GPUS, host, new, durable=durable)
            if durable:
                written[host] = new
            clock = max(clock, new["ts"])
            if host in held or state.get(HELD, host) is not None:
                release(host, new["ts"] + cfg.fresh_s)
            continue
        cond = cond_of(host) if host else None
        if not host or (cond is not None and cond["ts"] + cfg.fresh_s >= rec["window_end"]):
            out.append(_publish(rec, cond, cfg.cause))
        else:
            waiting = held_of(host)
            waiting["p"] = r.partition
            waiting["scores"].append(rec)
    owned = {r.partition for r in records}  # as in score_step: never act on a key of a partition since reassigned
    for host, stored in state.scan(HELD).items():  # hosts whose samples stopped: out once the rest moved on
        if stored["p"] in owned:
            release(host, clock - cfg.catch_up_s)
    state.memo["clock"] = clock
    for host, waiting in held.items():
        if waiting["scores"]:
            state.put(HELD, host, waiting, partition=waiting["p"])
        elif state.get(HELD, host) is not None:
            state.delete(HELD, host, partition=waiting["p"])
    return out


STAGE = StageSpec(
    name="stragglers",
    description="per-rank robust z of compute or arrival lateness, K of N windows, GPU throttle/temperature -> scores",
    steps=(Step("nccl", (Input(NCCL, "timing"),), score_step),
           Step("telemetry", (Input(SAMPLES, "sample"), Input(STRAGGLERS_BY_HOST, "score", check_candidate)),
                attribute_step)),
    outputs=(STRAGGLERS, STRAGGLERS_BY_HOST),
    tables=(StateTable(JOBS, "per-job window sums and K-of-N history", partitions=NCCL.partitions, live=JobState),
            StateTable(GPUS, "per-host compact GPU condition", partitions=SAMPLES.partitions),
            StateTable(HELD, "scores waiting for their host's samples to pass the window end",
                  partitions=SAMPLES.partitions)),
    config=stage_config,
    settings=(SETTING,),
)
