"""Views of outcomes over the derived tables: usable compute per day, interruptions, a node's drain episodes and
alert noise per day. `fleetpulse report` reads them; docs/outcomes.md gives each figure's SQL for analysts.

Each derived topic is delivered at least once (a worker that dies re-emits what it had not committed, under the same
stable id), so the views count distinct facts: a fault by its id, a state change by (host, state, since), an alert
firing by (fingerprint, starts_at)."""

from __future__ import annotations

from schemas.layout import Layout

USABLE_COMPUTE_1D = """SELECT
    toDate(minute_ts) AS day,
    count() AS minutes,
    max(nodes) AS nodes,
    sum(usable_gpus) / sum(installed_gpus) AS usable_compute,
    sum(installed_gpus) / 60 AS installed_gpu_hours,
    sum(usable_gpus) / 60 AS usable_gpu_hours,
    mapApply((bucket, gpus) -> (bucket, gpus / sum(installed_gpus)), sumMap(breakdown_gpus)) AS breakdown
FROM (
    SELECT minute_ts, any(nodes) AS nodes, any(installed_gpus) AS installed_gpus, any(usable_gpus) AS usable_gpus,
           any(breakdown_gpus) AS breakdown_gpus
    FROM {db}.usable_compute WHERE scope = 'fleet' GROUP BY minute_ts
)
GROUP BY day"""

# Faults on one host that begin within INCIDENT_GAP_S of the one before are one interruption: a GPU that falls off
# the bus logs Xid 79, Xid 154 (its recovery action) and a lost GPU; a GSP timeout logs Xid 119 and Xid 154. The
# interruption takes its code, bin and rule from the fault that leads it: the first that is neither binned ignore nor
# an echo of another Xid (Xid 45, Xid 154).
INCIDENT_GAP_S = 60
FOLLOWER_RULES = ("workflow_45", "workflow_154")

INTERRUPTIONS = """SELECT
    host, incident, min(started) AS ts, any(f_rack) AS rack,
    argMin(f_id, (lead, started)) AS fault_id, argMin(f_gpu, (lead, started)) AS gpu_index,
    argMin(f_code, (lead, started)) AS code, argMin(f_bin, (lead, started)) AS bin,
    argMin(f_rule, (lead, started)) AS rule, arraySort(groupUniqArray(f_code)) AS codes,
    groupUniqArray(f_id) AS fault_ids, count() AS faults, sum(f_count) AS occurrences
FROM (
    SELECT *, sum(starts) OVER (PARTITION BY host ORDER BY started, f_id ROWS UNBOUNDED PRECEDING) AS incident
    FROM (
        SELECT *, toFloat64(started) - lagInFrame(toFloat64(started), 1, 0.) OVER (PARTITION BY host
                  ORDER BY started, f_id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) > {gap} AS starts
        FROM (SELECT fault_id AS f_id, min(first_ts) AS started, any(host) AS host, any(rack) AS f_rack,
                     any(gpu_index) AS f_gpu, any(code) AS f_code, any(bin) AS f_bin, any(rule) AS f_rule,
                     max(count) AS f_count, (f_bin = 'ignore') * 2 + (f_rule IN {followers}) AS lead
              FROM {db}.faults GROUP BY fault_id)
    )
)
GROUP BY host, incident"""

NODE_EPISODES = """SELECT
    host, episode,
    minIfOrNull(since, state = 'drain_requested') AS drain_at,
    anyIf(fault_id, state = 'drain_requested') AS fault_id,
    anyIf(reason, state = 'drain_requested') AS reason,
    minIfOrNull(since, state = 'drained') AS drained_at,
    minIfOrNull(since, state = 'validating') AS validating_at,
    minIfOrNull(since, state = 'healthy' AND prev_state = 'validating') AS returned_at,
    minIfOrNull(since, state = 'replace') AS replace_at
FROM (
    SELECT host, state, prev_state, since, fault_id, reason,
           sum(state = 'drain_requested') OVER (PARTITION BY host ORDER BY since, state = 'drain_requested'
                                                ROWS UNBOUNDED PRECEDING) AS episode
    FROM (SELECT DISTINCT host, state, prev_state, since, evidence['fault_id'] AS fault_id, reason
          FROM {db}.node_states)
)
WHERE episode > 0
GROUP BY host, episode"""

ALERTS_1D = """SELECT
    toDate(starts_at) AS day, alertname, any(severity) AS severity, uniqExact(fingerprint, starts_at) AS fired,
    uniqExact(host) AS hosts
FROM {db}.alerts
WHERE status = 'firing'
GROUP BY day, alertname"""

OUTCOME_VIEWS: dict[str, str] = {
    "usable_compute_1d": USABLE_COMPUTE_1D,
    "interruptions": INTERRUPTIONS,
    "node_episodes": NODE_EPISODES,
    "alerts_1d": ALERTS_1D,
}


def create_outcome_views(layout: Layout) -> list[str]:
    return [f"CREATE OR REPLACE VIEW {layout.database}.{name}{layout.on} AS\n"
            f"{sql.format(db=layout.database, gap=INCIDENT_GAP_S, followers=FOLLOWER_RULES)}"
            for name, sql in OUTCOME_VIEWS.items()]
