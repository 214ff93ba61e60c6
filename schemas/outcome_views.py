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

INTERRUPTIONS = """SELECT
    fault_id, min(first_ts) AS ts, any(host) AS host, any(rack) AS rack, any(gpu_index) AS gpu_index,
    any(code) AS code, any(bin) AS bin, any(rule) AS rule, max(count) AS occurrences
FROM {db}.faults
GROUP BY fault_id"""

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
    return [f"CREATE OR REPLACE VIEW {layout.database}.{name}{layout.on} AS\n{sql.format(db=layout.database)}"
            for name, sql in OUTCOME_VIEWS.items()]
