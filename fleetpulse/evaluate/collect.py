"""What a run left behind, read back from the real store, and the report assembled from it with
fleetpulse.evaluate.score."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetpulse import outcomes
from fleetpulse.evaluate import score
from fleetpulse.evaluate.bot import REPAIR_KINDS
from core.clickhouse import connect
from sinks.settings import SinkSettings

if TYPE_CHECKING:
    from fleetpulse.evaluate.evaluation import Evaluation
    from sinks.sink import ClickHouseSink

# Columns read per table; times come back as epoch seconds.
QUERIES = {
    "truth": "SELECT fault_id, kind, cause, host, rack, gpu_index, job, rank, toFloat64(ts) AS ts, "
             "toFloat64(end_ts) AS end_ts, hardware, expected, allowed, params, toFloat64(kafka_ts) AS kafka_ts "
             "FROM sim_truth",
    "faults": "SELECT fault_id, host, gpu_index, code, bin, rule, count, toFloat64(first_ts) AS first_ts, "
              "toFloat64(ts) AS ts, toFloat64(kafka_ts) AS kafka_ts FROM faults",
    "alerts": "SELECT alertname, fingerprint, status, host, rack, gpu_index, toFloat64(starts_at) AS starts_at, "
              "toFloat64(ts) AS ts, toFloat64(kafka_ts) AS kafka_ts, labels['incident'] != '' AS condition, "
              "labels['job'] AS job FROM alerts",
    "stragglers": "SELECT job, rank, host, gpu_index, flagged, slowdown_pct, z, toFloat64(ts) AS ts, "
                  "toFloat64(kafka_ts) AS kafka_ts FROM stragglers WHERE flagged",
    "drains": "SELECT event_id, host, action, reason, toFloat64(ts) AS ts, toFloat64(kafka_ts) AS kafka_ts "
              "FROM drain_events",
    "states": "SELECT host, state, prev_state, toFloat64(ts) AS ts, kafka_partition, kafka_offset FROM node_states",
    "xid": "SELECT host, gpu_index, code, toFloat64(ts) AS ts, toFloat64(kafka_ts) AS kafka_ts FROM xid_events",
    "usable_compute": "SELECT toFloat64(minute_ts) AS minute_ts, nodes, usable_compute, breakdown FROM usable_compute",
}
COUNTS = ("gpu_samples", "xid_events", "nccl_timings", "agent_status", "net_ports", "host_events", "sim_truth", "health_scores", "faults",
          "stragglers", "alerts", "node_states", "drain_events", "remediation_results", "usable_compute")


def rows(settings: SinkSettings) -> dict[str, list[dict]]:
    """Every table the report needs, as lists of dicts, from the run's database."""
    client = connect(settings, "analyst")
    db = settings.clickhouse_database
    out: dict[str, list[dict]] = {}
    for name, sql in QUERIES.items():
        result = client.query(sql.replace(" FROM ", f" FROM {db}.", 1) if " FROM " in sql else sql)
        out[name] = [dict(zip(result.column_names, r)) for r in result.result_rows]
    counts = client.query(" UNION ALL ".join(f"SELECT '{t}', count() FROM {db}.{t}" for t in COUNTS)).result_rows
    out["counts"] = [{"table": t, "rows": int(n)} for t, n in counts]
    return out


def _injected_at(truth: list[dict], xid: list[dict]) -> dict[str, float]:
    """Wall time each fault entered Kafka: its first XID line's publish time where it logs one, else its truth
    record's (published in the same tick, just before the lines)."""
    first: dict[tuple, float] = {}
    for x in xid:
        key = (x["host"], x["gpu_index"], x["code"], round(x["ts"], 3))
        first[key] = min(first.get(key, x["kafka_ts"]), x["kafka_ts"])
    out = {}
    for t in truth:
        code = int(t["kind"][3:]) if t["kind"].startswith("xid") and t["kind"][3:].isdigit() else None
        at = first.get((t["host"], t["gpu_index"], code, round(t["ts"], 3))) if code is not None else None
        out[t["fault_id"]] = at if at is not None else t["kafka_ts"]
    return out


def report(ev: Evaluation, sim: dict, got: dict[str, list[dict]], sink: ClickHouseSink) -> dict:
    """The JSON report of one run."""
    from streams.lifecycle.breaker import BreakerConfig, cap
    from streams.lifecycle.rules import LifecycleConfig

    p = ev.plan
    lifecycle = LifecycleConfig.model_validate_json(p.streams_env.get("FLEETPULSE_LIFECYCLE", "{}"))
    brk = BreakerConfig.model_validate_json(p.streams_env.get("FLEETPULSE_BREAKER", "{}"))
    run = score.Run(start_ts=sim["start_ts"], end_ts=sim["end_ts"], hosts=p.hosts, gpus=sim["fleet_gpus"],
                    dwell_s=lifecycle.min_dwell_s, breaker_cap=cap(p.hosts, brk), breaker_window_s=brk.window_s,
                    out_s={kind: p.bot.out_s(kind) for kind in REPAIR_KINDS}, drain_s=p.bot.drain_s,
                    jobs=sim.get("jobs", {}))
    truth = score.seen_by_end(got["truth"], run)
    sigs = score.signals(got["faults"], got["alerts"], got["stragglers"], got["drains"])
    outcomes = score.match(truth, sigs, run)
    injected_at = _injected_at(truth, got["xid"])
    xid_drain = [o.drain.kafka_ts - injected_at[o.truth["fault_id"]] for o in outcomes
                 if o.drain is not None and o.truth["kind"].startswith("xid")]
    xid_fault = [s.kafka_ts - injected_at[o.truth["fault_id"]] for o in outcomes if o.truth["kind"].startswith("xid")
                 for tok, s in o.detected.items() if tok.startswith("fault:xid")]
    counts = {c["table"]: c["rows"] for c in got["counts"]}
    sent = sim.get("sent", {})
    simulated = sim["end_ts"] - sim["start_ts"] + p.interval_s
    return {
        "scenario": p.scenario.name, "seed": p.seed, "run": ev.tag, "database": ev.database,
        "topic_prefix": ev.settings.topic_prefix,
        "window": {"start_ts": run.start_ts, "end_ts": run.end_ts},  # the minutes the run's figures cover
        "fleet": {"hosts": p.hosts, "gpus": sim["fleet_gpus"], "interval_s": p.interval_s,
                  "nccl_interval_s": p.nccl_interval_s},
        "pace": {"simulated_s": simulated, "ticks": sim["ticks"], **ev.timings,
                 "speedup": round(simulated / max(ev.timings.get("publish_wall_s", 1.0), 1e-3), 2),
                 "max_worker_lag": sim["max_lag"], "lag_limit": sim.get("lag_limit"),
                 "waiting_for_worker_s": round(sim["lag_waits_s"], 1), "worker_restarts": ev.restarts},
        "accounting": {
            "samples_gpu_rows": {"sent": sim["gpu_readings"], "stored": counts.get("gpu_samples")},
            "xid_lines": {"sent": sent.get("fleet.telemetry.xid", 0), "stored": counts.get("xid_events")},
            "nccl_timings": {"sent": sim["nccl_timings"], "stored": counts.get("nccl_timings")},
            "agent_status": {"sent": sent.get("fleet.telemetry.agent", 0), "stored": counts.get("agent_status")},
            "net_ports": {"sent": sim.get("net_ports", 0), "stored": counts.get("net_ports")},
            "host_lines": {"sent": sent.get("fleet.telemetry.host_events", 0), "stored": counts.get("host_events")},
            "truth": {"sent": len(sim["truth"]), "stored": counts.get("sim_truth")},
            "dead_letters": {t: st.dead_letters for t, st in sink.stats.tables.items() if st.dead_letters},
            # at-least-once: a worker that dies re-emits what it had not committed, under the same stable id
            "fault_events": {"rows": len(got["faults"]), "distinct_ids": len({f["fault_id"] for f in got["faults"]})},
            "stored": counts,
        },
        "fault_kinds": score.per_kind(outcomes, sigs, injected_at),
        "hardware": score.hardware_recall(outcomes),
        "xid_to_fault_wall_s": score.quantiles(xid_fault),
        "xid_to_drain_wall_s": score.quantiles(xid_drain),
        "drains": score.drains(outcomes, sigs, truth, run),
        "stragglers": score.stragglers(outcomes, sigs),
        "transitions": score.transitions(got["states"], run),
        "breaker": score.breaker(got["alerts"], sigs, run),
        "alerts": score.alert_counts(got["alerts"], run),
        "remediation": {"answered": dict(ev.bot.answered), "unanswered_at_end": ev.bot.waiting,
                        "domain_repairs": len(ev.bot.shared)},
        "usable_compute": score.usable_compute(got["usable_compute"], truth, run),
        # memory ramps: how far ahead each was suspect, and what the jobs lost under each policy for a suspect
        "suspects": score.suspect_policies(truth, sigs, got["states"], run, lifecycle.job_restart_s),
        # what `fleetpulse report` prints over the run's database: the figures every view of a run shares
        "outcomes": run_outcomes(sink.settings),
    }


def run_outcomes(settings: SinkSettings) -> dict:
    """What `fleetpulse report` prints over the run's database (its default range: the whole run)."""
    ask = outcomes.asker(settings)
    return outcomes.figures(ask, outcomes.resolve(ask, None, None))
