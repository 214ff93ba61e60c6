"""The fleet's panels: fixed, named queries over the store's tables, rollups and views, each written with the time
macros of Grafana's ClickHouse data source (`$__timeFilter(col)`, `$__timeInterval(col)`, `$__fromTime`, …).

Grafana expands the macros itself (fleetpulse/grafana.py builds its dashboard from these panels); everywhere else
`expand` does it as the data source documents them, for a time range and a bucket width. No SQL text comes from
outside: a caller names a panel and gives the range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from fleetpulse import outcomes


@dataclass(frozen=True)
class Panel:
    name: str
    title: str
    kind: str  # timeseries, table, stat, bar, heatmap (host x GPU grid), timeline (lanes of events); in Grafana
    # heatmap and timeline are tables
    sql: str
    description: str
    unit: str = ""
    width: int = 12  # of 24 grid columns (Grafana's layout)
    fine_sql: str = ""  # for buckets under a minute (a demo's range): the same series from the raw rows


# The range as Grafana's data source writes it; fleetpulse/outcomes.py's queries take it as their [lo, hi).
_FROM, _TO = "$__fromTime_ms", "$__toTime_ms"


# Every host that reported in the range with its latest lifecycle state at the range's end (healthy if it never
# left healthy: node_states holds changes only).
_LATEST_STATES = """SELECT host, if(state = '', 'healthy', state) AS state
    FROM (SELECT DISTINCT host FROM gpu_samples WHERE $__timeFilter(ts)) AS reporting
    LEFT JOIN (SELECT host, argMax(state, (since, ts)) AS state FROM node_states WHERE since <= $__toTime_ms
               GROUP BY host) AS latest USING host"""

PANELS: list[Panel] = [
    Panel("usable_compute", "Usable compute", "timeseries", f"""
SELECT $__timeInterval(minute_ts) AS time, sum(usable_gpus) / sum(installed_gpus) AS usable_compute
FROM (SELECT minute_ts, any(usable_gpus) AS usable_gpus, any(installed_gpus) AS installed_gpus
      FROM usable_compute WHERE scope = 'fleet' AND {outcomes.minutes_in('minute_ts', _FROM, _TO)} GROUP BY minute_ts)
GROUP BY time ORDER BY time""",
          "Share of installed GPUs that were schedulable and not held back, per minute (every minute that overlaps "
          "the range, as the report counts them).", "percentunit", 16),
    Panel("usable_compute_now", "Usable compute (range)", "stat", f"""
SELECT gpu_weighted AS usable_compute, installed_gpu_hours, usable_gpu_hours
FROM ({outcomes.sql("usable_compute", _FROM, _TO)})""",
          "Over the whole range: usable GPU-hours out of installed GPU-hours (the figure `fleetpulse report` "
          "gives for the range).", "percentunit", 8),
    Panel("usable_compute_lost", "Where the rest went", "timeseries", f"""
SELECT $__timeInterval(minute_ts) AS time, bucket, sum(gpus) / sum(installed) AS share
FROM (SELECT minute_ts, any(installed_gpus) AS installed, any(breakdown_gpus) AS breakdown
      FROM usable_compute WHERE scope = 'fleet' AND {outcomes.minutes_in('minute_ts', _FROM, _TO)} GROUP BY minute_ts)
ARRAY JOIN mapKeys(breakdown) AS bucket, mapValues(breakdown) AS gpus
GROUP BY time, bucket ORDER BY time, bucket""",
          "Share of installed GPUs lost per cause (drained, validating, degraded, ...), per bucket.", "percentunit"),
    Panel("node_states", "Nodes per lifecycle state", "bar", f"""
SELECT state, count() AS nodes FROM ({_LATEST_STATES}) GROUP BY state ORDER BY nodes DESC""",
          "Nodes that reported in the range, by their lifecycle state at its end."),
    Panel("breaker", "Drain breaker", "stat", """
SELECT if((SELECT argMax(status, ts) FROM alerts WHERE alertname = 'FleetDrainBreakerOpen'
           AND ts <= $__toTime_ms) = 'firing', 'open', 'closed') AS breaker,
       toUInt32OrZero(extract(budget, '^(\\\\d+) of')) AS drains_in_window,
       toUInt32OrZero(extract(budget, ' of (\\\\d+) ')) AS cap,
       (SELECT count() FROM node_states WHERE reason LIKE 'drain denied, breaker open%' AND $__timeFilter(ts))
           AS denied_in_range
FROM (SELECT argMax(evidence['breaker'], since) AS budget FROM node_states
      WHERE state = 'drain_requested' AND since <= $__toTime_ms)""",
          "Open or closed at the end of the range; the drains its window held at the last admitted drain, of its "
          "cap; drains it denied in the range.", "", 8),
    Panel("incidents", "Incidents: fault, drain, repair, return; what paged; stragglers", "timeline", f"""
SELECT lane, what, start_s, end_s, detail FROM (
    SELECT host AS lane, 'fault' AS what, toFloat64(ts) AS start_s, toFloat64(ts) AS end_s,
           concat(code, ' -> ', bin, if(length(codes) > 1, concat(' (logged ', arrayStringConcat(codes, ', '), ')'),
                                        '')) AS detail
    FROM interruptions WHERE bin != 'ignore' AND {outcomes.events_in("ts", _FROM, _TO)}
    UNION ALL
    SELECT host, 'out of service', toFloat64(drain_at), toFloat64(coalesce(validating_at, replace_at, {_TO})), reason
    FROM node_episodes WHERE drain_at < {_TO} AND coalesce(validating_at, replace_at, {_TO}) >= {_FROM}
    UNION ALL
    SELECT host, 'validating', toFloat64(validating_at), toFloat64(coalesce(returned_at, {_TO})), 'repair done'
    FROM node_episodes WHERE validating_at < {_TO} AND coalesce(returned_at, {_TO}) >= {_FROM}
    UNION ALL
    SELECT host, 'returned', toFloat64(returned_at), toFloat64(returned_at), 'healthy after validation'
    FROM node_episodes WHERE {outcomes.events_in("returned_at", _FROM, _TO)}
    UNION ALL
    SELECT any(host), 'paged', toFloat64(starts_at),
           toFloat64(if(argMax(status, ts) = 'resolved', max(ts), {_TO})), any(alertname)
    FROM alerts WHERE labels['incident'] = '' AND severity != 'info' AND starts_at < {_TO}
    GROUP BY fingerprint, starts_at HAVING max(ts) >= {_FROM}
    UNION ALL
    SELECT arrayJoin(hosts_flagged), 'straggler', toFloat64(window_start), toFloat64(window_end),
           concat(job, ': ', toString(round(job_slowdown_pct, 1)), ' % slower')
    FROM job_windows WHERE ranks_flagged > 0 AND window_start < {_TO} AND window_end >= {_FROM}
) ORDER BY lane, start_s LIMIT 2000""",
          "Each host's incidents on one time axis: a fault (and the codes it logged), out of service from the "
          "drain request to the repair, validating, returned; alerts that paged; straggler windows.", "", 24),
    Panel("alerts", "Alerts fired", "table", """
SELECT starts_at, any(alertname) AS alertname, any(severity) AS severity,
       concat(any(host), if(any(gpu_index) IS NULL, '', concat(' GPU ', toString(any(gpu_index))))) AS where,
       argMax(status, ts) AS status, concat(toString(round(argMax(value, ts), 1)), ' / ',
                                            toString(round(any(threshold), 1))) AS value_of_threshold,
       argMax(summary, ts) AS summary
FROM alerts WHERE $__timeFilter(starts_at)
GROUP BY fingerprint, starts_at ORDER BY status = 'firing' DESC, starts_at DESC LIMIT 200""",
          "Alerts that started in the range, firing ones first, with their value against the threshold and their "
          "summary.", "", 24),
    Panel("alert_rate", "Pages per bucket", "timeseries", """
SELECT $__timeInterval(ts) AS time, alertname, uniqExact(fingerprint, ts) AS pages
FROM alerts WHERE status = 'firing' AND labels['incident'] = '' AND severity != 'info' AND $__timeFilter(ts)
GROUP BY time, alertname ORDER BY time, alertname""",
          "What paged someone per bucket: GPU and rack incidents opening or escalating, the breaker; the per-rule "
          "conditions inside an incident are its evidence, not pages (noise shows here first)."),
    Panel("drains", "Recent drains and their evidence", "table", """
SELECT ts, host, action, reason, evidence['cost.gpu_hours'] AS gpu_hours_at_stake, evidence, event_id
FROM drain_events WHERE $__timeFilter(ts)
ORDER BY ts DESC LIMIT 1 BY event_id LIMIT 100""",
          "Drain, repair, validation and return requests sent to the remediation bots, with the evidence behind "
          "each and, for a drain, what it stops and the GPU-hours it puts at stake.", "", 24),
    Panel("top_xids", "Top XIDs", "bar", """
SELECT toString(code) AS xid, count() AS events, uniqExact(host) AS hosts
FROM xid_events WHERE $__timeFilter(ts) GROUP BY code ORDER BY events DESC LIMIT 10""",
          "XID codes by events in the range, with the hosts that logged them."),
    Panel("interruptions", "Interruptions by fault bin", "bar", f"""
SELECT bin, count() AS interruptions, uniqExact(host) AS hosts FROM interruptions
WHERE {outcomes.events_in("ts", _FROM, _TO)} GROUP BY bin ORDER BY interruptions DESC""",
          "One per fault, however many lines and codes it logged (Xid 79 with its Xid 154 is one), by the bin of "
          "the fault that led it."),
    Panel("gpu_temperature", "Hottest GPU per node", "timeseries", """
SELECT $__timeInterval(minute) AS time, host, max(gpu_temp_c_max) AS gpu_temp_c
FROM node_1m WHERE $__timeFilter(minute) GROUP BY time, host ORDER BY time, host""",
          "Each node's hottest GPU per bucket (°C).", "celsius", fine_sql="""
SELECT $__timeInterval(ts) AS time, host, max(gpu_temp_c) AS gpu_temp_c
FROM gpu_samples WHERE $__timeFilter(ts) GROUP BY time, host ORDER BY time, host"""),
    Panel("node_power", "Power per node", "timeseries", """
SELECT $__timeInterval(minute) AS time, host, avg(power_w) AS power_w
FROM node_1m WHERE $__timeFilter(minute) GROUP BY time, host ORDER BY time, host""",
          "Mean board power of each node's GPUs together (W).", "watt", fine_sql="""
SELECT time, host, avg(node_w) AS power_w
FROM (SELECT $__timeInterval(ts) AS time, host, ts, sum(power_mw) / 1000 AS node_w
      FROM gpu_samples WHERE $__timeFilter(ts) GROUP BY time, host, ts)
GROUP BY time, host ORDER BY time, host"""),
    Panel("gpu_heatmap", "GPU temperature and power, fleet", "heatmap", """
SELECT host, gpu_index, round(avg(gpu_temp_c_avg), 1) AS gpu_temp_c, max(gpu_temp_c_max) AS gpu_temp_c_max,
       round(avg(power_w_avg)) AS power_w, round(max(throttled_share), 3) AS throttled_share
FROM gpu_1m WHERE $__timeFilter(minute) GROUP BY host, gpu_index ORDER BY host, gpu_index""",
          "Every GPU's mean and highest temperature, mean power and worst minute's throttled share over the range.",
          "", 24),
    Panel("rack_power", "Rack power against budget", "timeseries", """
SELECT $__timeInterval(minute) AS time, rack, avg(power_w) AS power_w, any(budget_w) AS budget_w
FROM rack_1m WHERE $__timeFilter(minute) GROUP BY time, rack ORDER BY time, rack""",
          "Each rack's mean power per bucket and its budget from the rack inventory (W).", "watt"),
    Panel("utilisation", "GPU utilisation, SM and tensor activity", "timeseries", """
SELECT $__timeInterval(minute) AS time, avg(gpu_util_pct_avg) / 100 AS gpu_util, avg(sm_active_avg) AS sm_active,
       avg(tensor_active_avg) AS tensor_active
FROM node_1m WHERE $__timeFilter(minute) GROUP BY time ORDER BY time""",
          "Fleet means: NVML utilisation, DCGM SM activity and tensor-pipe activity.", "percentunit", fine_sql="""
SELECT $__timeInterval(ts) AS time, avg(gpu_util_pct) / 100 AS gpu_util, avg(sm_active_permille) / 1000 AS sm_active,
       avg(tensor_active_permille) / 1000 AS tensor_active
FROM gpu_samples WHERE $__timeFilter(ts) GROUP BY time ORDER BY time"""),
    Panel("clocks_memory", "SM clock and framebuffer used", "timeseries", """
SELECT $__timeInterval(minute) AS time, avg(sm_clock_mhz_avg) AS sm_clock_mhz, avg(mem_used_mib_avg) AS fb_used_mib
FROM gpu_1m WHERE $__timeFilter(minute) GROUP BY time ORDER BY time""",
          "Fleet means of the SM clock (MHz) and framebuffer used (MiB).", fine_sql="""
SELECT $__timeInterval(ts) AS time, avg(sm_clock_mhz) AS sm_clock_mhz, avg(mem_used_mib) AS fb_used_mib
FROM gpu_samples WHERE $__timeFilter(ts) GROUP BY time ORDER BY time"""),
    Panel("errors", "ECC, row remaps, PCIe and NVLink errors", "timeseries", """
SELECT $__timeInterval(minute) AS time, sum(ecc_sbe_volatile_delta) AS ecc_sbe,
       sum(ecc_dbe_volatile_delta) AS ecc_dbe, sum(remapped_rows_uncorrectable_delta) AS rows_remapped_uncorrectable,
       sum(pcie_replay_count_delta) AS pcie_replays, sum(nvlink_crc_errors_delta) AS nvlink_crc
FROM node_1m WHERE $__timeFilter(minute) GROUP BY time ORDER BY time""",
          "Counter rises per bucket, fleet-wide."),
    Panel("stragglers", "Straggler windows", "table", """
SELECT window_start, job, metric, ranks, ranks_flagged, hosts_flagged, round(z_max, 1) AS z_max,
       round(slowdown_pct_max, 1) AS slowdown_pct_max, round(job_slowdown_pct, 1) AS job_slowdown_pct
FROM job_windows WHERE $__timeFilter(window_start) AND ranks_flagged > 0
ORDER BY window_start DESC LIMIT 100""",
          "Collective windows with a flagged rank: the ranks' hosts, the worst z-score and slowdown, the job's "
          "time lost."),
    Panel("return_times", "Fault to drain to return", "table", """
SELECT count() AS episodes,
       quantileExactInclusive(0.5)(dateDiff('second', drain_at, drained_at)) AS drain_p50_s,
       quantileExactInclusive(0.95)(dateDiff('second', drain_at, drained_at)) AS drain_p95_s,
       quantileExactInclusive(0.5)(dateDiff('second', drained_at, returned_at)) AS repair_to_return_p50_s,
       quantileExactInclusive(0.95)(dateDiff('second', drained_at, returned_at)) AS repair_to_return_p95_s,
       countIf(returned_at IS NOT NULL) AS returned, countIf(replace_at IS NOT NULL) AS replaced
FROM node_episodes WHERE $__timeFilter(drain_at)""",
          "Drain episodes that began in the range: request to drained, drained to returned (p50/p95), how many "
          "returned or went to replacement."),
    Panel("repeat_offenders", "Drain episodes per node", "table", """
SELECT host, count() AS episodes, min(drain_at) AS first_drain, max(drain_at) AS last_drain,
       groupUniqArray(reason) AS reasons
FROM node_episodes WHERE $__timeFilter(drain_at) GROUP BY host ORDER BY episodes DESC, last_drain DESC LIMIT 20""",
          "The hosts with the most drain episodes in the range (repeat offenders first)."),
]

BY_NAME: dict[str, Panel] = {p.name: p for p in PANELS}

_MACRO = re.compile(r"\$__(\w+)(?:\(([^()]*)\))?")


def expand(sql: str, start: datetime, end: datetime, interval_s: int) -> str:
    """`sql` with the data source's macros written out for [start, end] and buckets of `interval_s` seconds, as
    grafana-clickhouse-datasource documents them (seconds as toDateTime, milliseconds as fromUnixTimestamp64Milli)."""
    lo, hi = (int(t.astimezone(timezone.utc).timestamp()) for t in (start, end))
    lo_ms, hi_ms = (int(t.astimezone(timezone.utc).timestamp() * 1000) for t in (start, end))
    step = max(int(interval_s), 1)

    def one(m: re.Match) -> str:
        name, arg = m.group(1), (m.group(2) or "").strip()
        if name in ("timeFilter", "timeFilter_ms", "dateFilter", "timeInterval", "timeInterval_ms") and not arg:
            raise ValueError(f"$__{name} needs a column")
        if name == "timeFilter":
            return f"{arg} >= toDateTime({lo}) AND {arg} <= toDateTime({hi})"
        if name == "timeFilter_ms":
            return f"{arg} >= fromUnixTimestamp64Milli({lo_ms}) AND {arg} <= fromUnixTimestamp64Milli({hi_ms})"
        if name == "dateFilter":
            return f"{arg} >= toDate('{start:%Y-%m-%d}') AND {arg} <= toDate('{end:%Y-%m-%d}')"
        if name == "timeInterval":
            return f"toStartOfInterval(toDateTime({arg}), INTERVAL {step} second)"
        if name == "timeInterval_ms":
            return f"toStartOfInterval(toDateTime64({arg}, 3), INTERVAL {step * 1000} millisecond)"
        plain = {"fromTime": f"toDateTime({lo})", "toTime": f"toDateTime({hi})",
                 "fromTime_ms": f"fromUnixTimestamp64Milli({lo_ms})", "toTime_ms": f"fromUnixTimestamp64Milli({hi_ms})",
                 "interval_s": str(step)}
        if name not in plain:
            raise ValueError(f"unknown macro $__{name}")
        return plain[name] + (f"({m.group(2)})" if m.group(2) is not None else "")

    return _MACRO.sub(one, sql)
