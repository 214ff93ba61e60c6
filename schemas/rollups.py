"""Rollups: materialized views from the raw tables into AggregatingMergeTree tables, and the plain views over them
that analysts and dashboards query (docs/rollups.md).

Each rollup is an aggregating SELECT over one raw table. The same SELECT creates the rollup's table (its column types
are what the SELECT returns: aggregate states, or SimpleAggregateFunction where the value reads as it is), feeds it as
a materialized view on every insert, and backfills it from the rows a store already holds. Inserts into the raw table
carry the sink's deduplication token, and with `deduplicate_blocks_in_dependent_materialized_views` the views' blocks
are deduplicated by it too: a replayed batch changes no rollup."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.layout import Layout
from schemas.throttle import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL

# Monotonic counters whose rise per minute the GPU rollup keeps (the gpu_1m view reads energy in J, throttle time in s).
COUNTERS = (
    "energy_mj", "throttle_power_ns", "throttle_thermal_ns",
    "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    "retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "pcie_replay_count", "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors",
)
# Gauges kept as a mean and a maximum (the stored, scaled column: power in mW, activity in permille).
GAUGES = ("gpu_temp_c", "hbm_temp_c", "power_mw", "gpu_util_pct", "mem_util_pct", "sm_active_permille",
          "tensor_active_permille", "sm_clock_mhz", "mem_clock_mhz", "mem_used_mib")
# Throttle reasons that cost speed (idle and application-clock settings do not).
THROTTLING = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


def simple(func: str, expr: str, type_: str) -> str:
    """A value that merges by `func` and reads as it is (SimpleAggregateFunction)."""
    return f"CAST({func}({expr}) AS SimpleAggregateFunction({func}, {type_}))"


@dataclass(frozen=True)
class Rollup:
    """One rollup: its table, the raw table it is fed from, its sort key and the SELECTs that aggregate it.

    `select` names its source as `{source}`; its columns make the table. `more` are further SELECTs into the same table
    that fill only the `more_columns` they name (the rest of their rows is empty states), each fed by its own view.
    `time_column` is the rollup's bucket (its partition and retention)."""

    name: str
    source: str
    order_by: tuple[str, ...]
    time_column: str
    select: str
    more: tuple[str, ...] = ()
    more_columns: tuple[tuple[str, str], ...] = ()
    shard_by: str = "host"  # on a cluster, as its source table's (a key's rows merge on one shard)

    def aggregates(self, database: str, source: str | None = None) -> list[str]:
        """The SELECTs, reading `source` (default: the raw table by its name)."""
        source = source or f"{database}.{self.source}"
        return [sql.format(source=source) for sql in (self.select, *self.more)]

    def view_names(self) -> list[str]:
        return [f"{self.name}_mv"] + [f"{self.name}_mv{k}" for k in range(2, len(self.more) + 2)]

    def create(self, layout: Layout, ttl: str, settings: str) -> list[str]:
        """The table (made from `select`, its columns the SELECT's), its further columns, its Distributed table on a
        cluster, and the views feeding it (on a cluster each shard's views read its own rows)."""
        here, on = layout.local(self.name), layout.on
        out = [f"CREATE TABLE IF NOT EXISTS {here}{on}\nENGINE = {layout.engine('AggregatingMergeTree', self.name)}\n"
               f"PARTITION BY toYYYYMM({self.time_column})\nORDER BY ({', '.join(self.order_by)})\n"
               f"TTL {ttl}\nSETTINGS {settings}\nEMPTY AS {self.aggregates(layout.database)[0]}"]
        out += [f"ALTER TABLE {here}{on} ADD COLUMN IF NOT EXISTS `{name}` {type_}"
                for name, type_ in self.more_columns]
        out += layout.distributed(self.name, self.shard_by)
        if layout.cluster:  # a Distributed table made before a further column was added gets it too
            out += [f"ALTER TABLE {layout.database}.{self.name}{on} ADD COLUMN IF NOT EXISTS `{name}` {type_}"
                    for name, type_ in self.more_columns]
        sources = self.aggregates(layout.database, layout.local(self.source))
        return out + [f"CREATE MATERIALIZED VIEW IF NOT EXISTS {layout.database}.{view}{on} TO {here}\nAS {sql}"
                      for view, sql in zip(self.view_names(), sources)]

    def backfill(self, database: str, sql: str, columns: list[str]) -> str:
        """One of the SELECTs over the rows already stored, into the `columns` it returns."""
        return f"INSERT INTO {database}.{self.name} ({', '.join(f'`{c}`' for c in columns)}) {sql}"


GPU_KEYS = "cluster, rack, host, gpu_index, gpu_uuid"
LAST_READING = "AggregateFunction(argMax, Nullable(UInt64), DateTime64(3, 'UTC'))"


def _gpu_minute_select() -> str:
    """Per GPU per minute: gauges as mean and maximum, counters as lowest, highest and last reading (their rise is
    worked out in the gpu_1m view)."""
    cols = [
        GPU_KEYS, "toStartOfMinute(toDateTime(ts)) AS minute",
        simple("anyLast", "job", "LowCardinality(Nullable(String))") + " AS job",
        simple("anyLast", "gpu_model", "LowCardinality(Nullable(String))") + " AS gpu_model",
        "CAST(count() AS SimpleAggregateFunction(sum, UInt64)) AS samples",
        f"CAST(countIf(bitAnd(throttle_reasons, {THROTTLING}) != 0) AS SimpleAggregateFunction(sum, UInt64))"
        " AS throttled_samples",
        simple("min", "power_limit_mw", "Nullable(UInt32)") + " AS power_limit_mw",
        simple("max", "toUInt8(row_remap_pending)", "Nullable(UInt8)") + " AS row_remap_pending",
        simple("max", "toUInt8(row_remap_failure)", "Nullable(UInt8)") + " AS row_remap_failure",
    ]
    for g in GAUGES:
        cols += [f"avgState({g}) AS {g}_avg", f"{simple('max', g, _gauge_type(g))} AS {g}_max"]
    cols.append(f"{simple('min', 'sm_clock_mhz', 'Nullable(UInt16)')} AS sm_clock_mhz_min")
    for c in COUNTERS:
        cols += [f"{simple('min', c, 'Nullable(UInt64)')} AS {c}_min",
                 f"{simple('max', c, 'Nullable(UInt64)')} AS {c}_max", f"argMaxState({c}, ts) AS {c}_last"]
    body = ",\n    ".join(cols)
    return f"SELECT\n    {body}\nFROM {{source}}\nGROUP BY {GPU_KEYS}, minute"


def _gpu_previous_minute_select() -> str:
    """Each minute's last counter readings, filed under the next minute as its `_prev`: a counter's rise in a minute is
    its last reading less the one before the minute began, steps across the boundary included, with no state kept
    between inserts (the rows of a minute without samples of its own are left out by the view)."""
    prev = ",\n    ".join(f"argMaxState({c}, ts) AS {c}_prev" for c in COUNTERS)
    return (f"SELECT\n    {GPU_KEYS}, toStartOfMinute(toDateTime(ts)) + toIntervalMinute(1) AS minute,\n    {prev}\n"
            f"FROM {{source}}\nGROUP BY {GPU_KEYS}, minute")


def _gauge_type(gauge: str) -> str:
    return {"gpu_temp_c": "Nullable(Int16)", "hbm_temp_c": "Nullable(Int16)", "power_mw": "Nullable(UInt32)",
            "sm_active_permille": "Nullable(UInt16)", "tensor_active_permille": "Nullable(UInt16)",
            "sm_clock_mhz": "Nullable(UInt16)", "mem_clock_mhz": "Nullable(UInt16)",
            "mem_used_mib": "Nullable(Float64)"}.get(gauge, "Nullable(UInt8)")


FLEET_DAY_SELECT = f"""SELECT
    cluster,
    toDate(ts) AS day,
    {simple('sum', 'toUInt64(1)', 'UInt64')} AS gpu_samples,
    uniqState(gpu_uuid) AS gpus,
    uniqState(host) AS hosts,
    avgState(gpu_temp_c) AS gpu_temp_c_avg,
    {simple('max', 'gpu_temp_c', 'Nullable(Int16)')} AS gpu_temp_c_max,
    avgState(power_mw) AS power_mw_avg,
    {simple('max', 'power_mw', 'Nullable(UInt32)')} AS power_mw_max,
    avgState(gpu_util_pct) AS gpu_util_pct_avg,
    avgState(sm_active_permille) AS sm_active_permille_avg,
    avgState(tensor_active_permille) AS tensor_active_permille_avg,
    {simple('sum', f'toUInt64(bitAnd(assumeNotNull(throttle_reasons), {THROTTLING}) != 0)', 'UInt64')}
        AS throttled_samples
FROM {{source}}
GROUP BY cluster, day"""

JOB_WINDOW_SELECT = f"""SELECT
    job,
    metric,
    toDateTime(window_start) AS window_start,
    {simple('max', 'toDateTime(window_end)', "DateTime('UTC')")} AS window_end,
    uniqExactState(rank) AS ranks,
    uniqExactStateIf(rank, flagged) AS ranks_flagged,
    groupUniqArrayStateIf(host, flagged) AS hosts_flagged,
    {simple('max', 'z', 'Float64')} AS z_max,
    {simple('max', 'slowdown_pct', 'Float64')} AS slowdown_pct_max,
    {simple('max', 'job_slowdown_pct', 'Float64')} AS job_slowdown_pct
FROM {{source}}
GROUP BY job, metric, window_start"""

ROLLUPS: dict[str, Rollup] = {
    r.name: r
    for r in [
        Rollup("rollup_gpu_1m", "gpu_samples", ("cluster", "rack", "host", "gpu_index", "gpu_uuid", "minute"),
               "minute", _gpu_minute_select(), more=(_gpu_previous_minute_select(),),
               more_columns=tuple((f"{c}_prev", LAST_READING) for c in COUNTERS)),
        Rollup("rollup_fleet_1d", "gpu_samples", ("cluster", "day"), "day", FLEET_DAY_SELECT, shard_by="cluster"),
        Rollup("rollup_job_window", "stragglers", ("job", "metric", "window_start"), "window_start",
               JOB_WINDOW_SELECT, shard_by="job"),
    ]
}
