"""Plain views over the rollups: one row per GPU, node or rack per minute, per cluster per day and per job window,
each aggregate state merged and each counter's rise worked out (docs/rollups.md has every column).

They hold no data, so a new version replaces them (CREATE OR REPLACE). A WHERE on their keys or bucket reaches the
rollup table's sort key through the GROUP BY."""

from __future__ import annotations

from schemas.layout import Layout
from schemas.rollups import COUNTERS, GAUGES

# Counter rises read in the unit an analyst wants; the rest are counts of events.
RISE_AS = {"energy_mj": ("energy_j", 1000), "throttle_power_ns": ("throttle_power_s", 1e9),
           "throttle_thermal_ns": ("throttle_thermal_s", 1e9)}
SCALED = {"power_mw": ("power_w", 1000), "sm_active_permille": ("sm_active", 1000),
          "tensor_active_permille": ("tensor_active", 1000)}
KEYS = "cluster, rack, host, gpu_index, gpu_uuid, minute"


def rise(counter: str) -> str:
    """A counter's rise within one minute: its last reading less the previous minute's last, or less the minute's
    lowest when there was no previous minute (a GPU's first, or after a gap). A last reading below that base means the
    counter was reset (a driver reload clears the volatile ECC counts): the rise is then what it gained up to its
    highest before the reset plus what it gained from zero after it (exact for one reset in a minute)."""
    mn, mx, last, prev = (f"{counter}_{k}" for k in ("min", "max", "last", "prev"))
    base = f"coalesce({prev}, {mn})"
    return f"toUInt64(if({last} >= {base}, {last} - {base}, {mx} - {base} + {last}))"


def _gpu_minute() -> str:
    merged = [KEYS, "anyLast(job) AS job", "anyLast(gpu_model) AS gpu_model", "sum(samples) AS samples",
              "sum(throttled_samples) AS throttled_samples", "min(power_limit_mw) AS power_limit_mw",
              "max(row_remap_pending) AS row_remap_pending", "max(row_remap_failure) AS row_remap_failure",
              "min(sm_clock_mhz_min) AS sm_clock_mhz_min"]
    merged += [f"avgMerge({g}_avg) AS {g}_avg, max({g}_max) AS {g}_max" for g in GAUGES]
    merged += [f"min({c}_min) AS {c}_min, max({c}_max) AS {c}_max, argMaxMerge({c}_last) AS {c}_last, "
               f"argMaxMerge({c}_prev) AS {c}_prev" for c in COUNTERS]
    out = [KEYS, "job", "gpu_model", "samples", "throttled_samples", "throttled_samples / samples AS throttled_share",
           "power_limit_mw / 1000 AS power_limit_w", "row_remap_pending", "row_remap_failure", "sm_clock_mhz_min"]
    for g in GAUGES:
        name, div = SCALED.get(g, (g, 1))
        scale = f" / {div}" if div != 1 else ""
        out += [f"{g}_avg{scale} AS {name}_avg", f"{g}_max{scale} AS {name}_max"]
    for c in COUNTERS:
        name, div = RISE_AS.get(c, (f"{c}_delta", 1))
        out.append(f"{rise(c)}{f' / {div}' if div != 1 else ''} AS {name}")
    return (f"SELECT\n    {', '.join(out)}\nFROM (\n    SELECT {', '.join(merged)}\n"
            f"    FROM {{db}}.rollup_gpu_1m\n    GROUP BY {KEYS}\n    HAVING samples > 0\n)")


def _sum_rises() -> str:
    return ", ".join(f"sum({RISE_AS.get(c, (f'{c}_delta',))[0]}) AS {RISE_AS.get(c, (f'{c}_delta',))[0]}"
                     for c in COUNTERS)


NODE_MINUTE = f"""SELECT
    cluster, rack, host, minute,
    count() AS gpus, sum(samples) AS samples, arraySort(groupUniqArray(job)) AS jobs,
    avg(gpu_temp_c_avg) AS gpu_temp_c_avg, max(gpu_temp_c_max) AS gpu_temp_c_max, max(hbm_temp_c_max) AS hbm_temp_c_max,
    sum(power_w_avg) AS power_w, max(power_w_max) AS gpu_power_w_max, sum(power_limit_w) AS power_limit_w,
    avg(gpu_util_pct_avg) AS gpu_util_pct_avg, avg(sm_active_avg) AS sm_active_avg,
    avg(tensor_active_avg) AS tensor_active_avg, avg(mem_util_pct_avg) AS mem_util_pct_avg,
    avg(sm_clock_mhz_avg) AS sm_clock_mhz_avg, min(sm_clock_mhz_min) AS sm_clock_mhz_min,
    sum(throttled_samples) / samples AS throttled_share,
    {_sum_rises()}
FROM {{db}}.gpu_1m
GROUP BY cluster, rack, host, minute"""

RACK_MINUTE = """SELECT
    cluster, rack, minute, hosts, gpus, power_w, budget_w, power_w / budget_w AS budget_share, power_limit_w,
    gpu_temp_c_max, throttled_share, energy_j
FROM (
    SELECT
        cluster, rack, minute,
        uniqExact(host) AS hosts, count() AS gpus,
        sum(power_w_avg) AS power_w, sum(power_limit_w) AS power_limit_w,
        max(gpu_temp_c_max) AS gpu_temp_c_max, sum(throttled_samples) / sum(samples) AS throttled_share,
        sum(energy_j) AS energy_j
    FROM {db}.gpu_1m
    GROUP BY cluster, rack, minute
) AS r
LEFT JOIN (
    SELECT rack, argMax(budget_w, set_at) AS budget_w FROM {db}.rack_budgets GROUP BY rack
) AS b USING rack
SETTINGS join_use_nulls = 1"""

FLEET_DAY = """SELECT
    cluster, day,
    sum(gpu_samples) AS gpu_samples, uniqMerge(gpus) AS gpus, uniqMerge(hosts) AS hosts,
    avgMerge(gpu_temp_c_avg) AS gpu_temp_c_avg, max(gpu_temp_c_max) AS gpu_temp_c_max,
    avgMerge(power_mw_avg) / 1000 AS gpu_power_w_avg, max(power_mw_max) / 1000 AS gpu_power_w_max,
    avgMerge(gpu_util_pct_avg) AS gpu_util_pct_avg, avgMerge(sm_active_permille_avg) / 1000 AS sm_active_avg,
    avgMerge(tensor_active_permille_avg) / 1000 AS tensor_active_avg,
    sum(throttled_samples) / gpu_samples AS throttled_share
FROM {db}.rollup_fleet_1d
GROUP BY cluster, day"""

JOB_WINDOWS = """SELECT
    job, metric, window_start, max(window_end) AS window_end,
    uniqExactMerge(ranks) AS ranks, uniqExactMerge(ranks_flagged) AS ranks_flagged,
    arraySort(groupUniqArrayMerge(hosts_flagged)) AS hosts_flagged,
    max(z_max) AS z_max, max(slowdown_pct_max) AS slowdown_pct_max, max(job_slowdown_pct) AS job_slowdown_pct
FROM {db}.rollup_job_window
GROUP BY job, metric, window_start"""

VIEWS: dict[str, str] = {
    "gpu_1m": _gpu_minute(),
    "node_1m": NODE_MINUTE,
    "rack_1m": RACK_MINUTE,
    "fleet_1d": FLEET_DAY,
    "job_windows": JOB_WINDOWS,
}


def create_views(layout: Layout) -> list[str]:
    """In order: node_1m and rack_1m read gpu_1m."""
    return [f"CREATE OR REPLACE VIEW {layout.database}.{name}{layout.on} AS\n{sql.format(db=layout.database)}"
            for name, sql in VIEWS.items()]
