"""A fleet at scale, in real time, through the whole pipeline on this machine, measured over time (issue 41).

    python bench/fleet_scale.py --hosts 12500 --minutes 60 [--out bench/results/fleet_scale.json]

Starts the project's broker and ClickHouse server in a data directory and on ports of its own, then runs
`fleetpulse up --scenario fleet-scale --hosts N --speed 1` (a sample every 10 s from every host, NCCL timings every
10 s, the Llama 3 fault mix on 0.4 % of the hosts; the stream worker, sink, lag watch, page and simulated bot as `up`
runs them) and every --every seconds reads:
- each consumer group's lag in time, from the lag watch (`fleetpulse_pipeline_lag_seconds`, worst topic);
- each stage's and the sink's event-time lag (their `/metrics`: `*_lag_seconds`);
- every process's CPU and resident memory (/proc): simulator, stream workers, sink, watch, `up` itself (bot, page,
  view), the broker and the store;
- the broker's and the store's bytes on disk;
- the page's answer time over the run's data (`/api/outcomes` and a panel, the last 15 minutes).
After the run: lag p50/p95/p99 per group, XID -> drain p50/p95/p99 (a drain request's Kafka time after the last XID
line of its host; whole run and last three quarters), resident memory over the last three quarters (first, last,
least-squares trend per hour and over the window, the growth of its floor: the lowest of the last tenth against the
lowest of the first, and of its peaks: the highest of the last quarter against the highest of the first; a process
that swings, as a store merging, has a trend that depends on where the samples fall, and is flat when neither its
floor nor its peaks rise), disk per hour and per day, `fleetpulse report`'s answer time over the whole run, and
`up`'s sent = stored per stream. Both services are stopped at the end (the data directory stays, for a look:
--data). --stop-sink-at MIN stops the sink (SIGSTOP) that many minutes in for --stop-sink-for seconds and says when
the watch's PipelineLagging fired and resolved.
The broker's fixed 1 GB heap is touched whole at its start (-XX:+AlwaysPreTouch, through JAVA_TOOL_OPTIONS), as
production brokers are often run: without it the broker's resident memory grows for an hour as the heap's pages are
first used (+10 % over the last 45 minutes at 6,000 hosts) and hides what it really keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "fleetpulse.cli"]
TICK = os.sysconf("SC_CLK_TCK")


def ports(base: int) -> dict[str, str]:
    return {"FLEETPULSE_LOCAL_KAFKA_PORT": str(base), "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT": str(base + 100),
            "FLEETPULSE_LOCAL_CLICKHOUSE_TCP_PORT": str(base + 101), "FLEETPULSE_SINK_PORT": str(base + 102),
            "FLEETPULSE_PAGE_PORT": str(base + 103), "FLEETPULSE_WATCH_METRICS_PORT": str(base + 104),
            "FLEETPULSE_STREAMS_METRICS_PORT": str(base + 105)}  # the decisions worker: + 1


def processes(data: Path, up_pid: int) -> dict[int, str]:
    """pid -> role of every process of the run: `up`'s descendants, and the broker and store started in `data`."""
    parent, cmd = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    mine = {up_pid}
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine} - mine
        mine |= more
        grew = bool(more)
    roles = {}
    for pid, line in cmd.items():
        if pid != os.getpid() and (pid in mine or str(data) in line):
            roles[pid] = role(line, pid == up_pid)
    return roles


def role(cmdline: str, is_up: bool) -> str:
    if is_up:
        return "up (bot, page, view)"
    for needle, name in (("kafka.Kafka", "broker"), ("clickhouse", "store"), (" simulate", "simulator"),
                         ("--worker decisions", "streams decisions"), ("--worker telemetry", "streams telemetry+"),
                         (" streams", "streams telemetry"), (" sink", "sink"), (" watch", "watch")):
        if needle in cmdline:
            return name
    return cmdline[:60]


def usage(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, resident bytes) of one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    except (OSError, StopIteration, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, rss


def disk(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def changelog_bytes(kafka: Path) -> int:
    """Bytes of the stream workers' table changelogs on the broker (their topic-partition folders)."""
    return sum(disk(d) for d in kafka.rglob("*-changelog-*") if d.is_dir())


def state_entries(env: dict[str, str]) -> dict[str, float]:
    """Per stage, the keys its tables hold (fleetpulse_stage_state_entries of both workers)."""
    base = int(env["FLEETPULSE_STREAMS_METRICS_PORT"])
    return {dict(labels)["stage"]: v for port in (base, base + 1) for (name, labels), v in scrape(str(port)).items()
            if name == "fleetpulse_stage_state_entries"}


def scrape(port: str, timeout: float = 5.0) -> dict[tuple[str, tuple], float]:
    """(metric, labels) -> value of a /metrics page; empty when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def lags(env: dict[str, str]) -> dict[str, float]:
    """Per group (the watch), per stage and per sink table (their own event-time lag), seconds."""
    out: dict[str, float] = {}
    for (name, labels), v in scrape(env["FLEETPULSE_WATCH_METRICS_PORT"]).items():
        if name == "fleetpulse_pipeline_lag_seconds":
            group = dict(labels)["group"].removeprefix(env["FLEETPULSE_TOPIC_PREFIX"])
            out[f"group {group}"] = max(out.get(f"group {group}", 0.0), v)
    base = int(env["FLEETPULSE_STREAMS_METRICS_PORT"])
    for port in (str(base), str(base + 1), env["FLEETPULSE_SINK_PORT"]):
        for (name, labels), v in scrape(port).items():
            if name in ("fleetpulse_stage_lag_seconds", "fleetpulse_sink_lag_seconds"):
                key = dict(labels).get("stage") or f"sink {dict(labels)['table']}"
                out[f"event-time {key}"] = v
    return out


def timed_get(url: str) -> float | None:
    began = time.perf_counter()
    try:
        urllib.request.urlopen(url, timeout=60).read()
    except OSError:
        return None
    return round(time.perf_counter() - began, 3)


def page_times(env: dict[str, str]) -> dict[str, float | None]:
    base = f"http://127.0.0.1:{env['FLEETPULSE_PAGE_PORT']}"
    try:
        span = json.loads(urllib.request.urlopen(f"{base}/api/span", timeout=60).read())
    except (OSError, ValueError):
        return {}
    to = span["last"] + 1000
    since = max(span["first"], to - span["default_span_ms"])
    return {"outcomes_s": timed_get(f"{base}/api/outcomes?from={since}&to={to}"),
            "gpu_temperature_s": timed_get(f"{base}/api/panel/gpu_temperature?from={since}&to={to}")}


def quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values = sorted(values)
    at = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": round(at(0.5), 3), "p95": round(at(0.95), 3), "p99": round(at(0.99), 3),
            "max": round(values[-1], 3)}


XID_TO_DRAIN = """SELECT toFloat64(d.kafka_ts) - toFloat64(x.kafka_ts) AS s, toFloat64(d.kafka_ts)
FROM (SELECT event_id, any(host) AS host, min(kafka_ts) AS kafka_ts FROM drain_events WHERE action = 'drain'
      GROUP BY event_id) AS d
ASOF JOIN (SELECT host, kafka_ts FROM xid_events) AS x ON d.host = x.host AND d.kafka_ts >= x.kafka_ts
WHERE s < 300 FORMAT JSONCompact"""


def run(args: argparse.Namespace) -> dict:
    data = args.data.resolve()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "KAFKA_", "CLICKHOUSE"))},
           **ports(args.port), "FLEETPULSE_DATA_DIR": str(data), "FLEETPULSE_TOPIC_PREFIX": "",
           "PYTHONPATH": str(REPO)}
    shutil.rmtree(data, ignore_errors=True)  # a fresh run; `up --keep` then leaves the services it did not start
    for service, more in (("kafka", {"JAVA_TOOL_OPTIONS": "-XX:+AlwaysPreTouch"}), ("clickhouse", {})):
        subprocess.run([*CLI, service, "start"], env={**env, **more}, check=True, capture_output=True, timeout=300)
    seconds = args.minutes * 60
    up_log = data.parent / f"{data.name}-up.log"
    with up_log.open("wb") as log:
        up = subprocess.Popen([*CLI, "up", "--scenario", "fleet-scale", "--hosts", str(args.hosts), "--speed", "1",
                               "--duration", str(seconds), "--seed", str(args.seed), "--plain", "--json", "--keep"],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=log)
    began, rounds, cpu_before = time.time(), [], {}
    stop = SinkStop(args.stop_sink_at * 60, args.stop_sink_for, env) if args.stop_sink_at is not None else None
    try:
        while up.poll() is None:
            time.sleep(args.every if stop is None else 1.0)
            now = time.time()
            if stop is not None:
                stop.step(now - began, processes(data, up.pid))
            if rounds and now - began - rounds[-1]["t_s"] < args.every:
                continue
            procs, usage_now = processes(data, up.pid), {}
            for pid, name in procs.items():
                got = usage(pid)
                if got is None:
                    continue
                cpu, rss = got
                prev = cpu_before.get(pid)
                entry = usage_now.setdefault(name, {"cores": 0.0, "rss_mb": 0.0})
                entry["rss_mb"] = round(entry["rss_mb"] + rss / 2**20, 1)
                if prev is not None:
                    entry["cores"] = round(entry["cores"] + (cpu - prev[0]) / max(now - prev[1], 1e-9), 2)
                cpu_before[pid] = (cpu, now)
            rounds.append({"t_s": round(now - began), "lag_s": lags(env), "processes": usage_now,
                           "broker_bytes": disk(data / "kafka"), "store_bytes": disk(data / "clickhouse"),
                           "changelog_bytes": changelog_bytes(data / "kafka"), "state_entries": state_entries(env),
                           **({"page": page_times(env)} if len(rounds) % args.page_every == 0 else {})})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        result = json.loads(up.stdout.read() or b"{}")
        began_report = time.perf_counter()
        report = subprocess.run([*CLI, "report", "--json"], env=env, capture_output=True, timeout=600)
        report_s = round(time.perf_counter() - began_report, 2)
        got = subprocess.run([*CLI, "query", XID_TO_DRAIN], env=env, capture_output=True, text=True, timeout=300)
        drains = [[round(at - began, 1), s] for s, at in json.loads(got.stdout)["data"]] if got.returncode == 0 else []
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=300)
        for service in ("kafka", "clickhouse"):
            subprocess.run([*CLI, service, "stop"], env=env, capture_output=True, timeout=300)
    out = summary(args, rounds, result, drains, report_s, report.returncode)
    if stop is not None:
        out["sink_stopped"] = stop.facts
    return out


class SinkStop:
    """SIGSTOP the sink `at_s` into the run for `for_s`, and when the watch's PipelineLagging for the sink's group
    fired and resolved (its fleetpulse_pipeline_lagging gauge, read every second)."""

    def __init__(self, at_s: float, for_s: float, env: dict[str, str]):
        self.at_s, self.for_s, self.env = at_s, for_s, env
        self.facts: dict = {"stop_at_s": at_s, "stopped_for_s": for_s}
        self.pid: int | None = None

    def step(self, t: float, procs: dict[int, str]) -> None:
        if self.pid is None and t >= self.at_s:
            self.pid = next((p for p, name in procs.items() if name == "sink"), None)
            if self.pid is not None:
                os.kill(self.pid, signal.SIGSTOP)
                self.facts["stopped_at_s"] = round(t, 1)
        elif self.pid is not None and "resumed_at_s" not in self.facts and t >= self.facts["stopped_at_s"] + self.for_s:
            os.kill(self.pid, signal.SIGCONT)
            self.facts["resumed_at_s"] = round(t, 1)
        if self.pid is None:
            return
        lagging = any(v for (name, labels), v in scrape(self.env["FLEETPULSE_WATCH_METRICS_PORT"], 2.0).items()
                      if name == "fleetpulse_pipeline_lagging" and dict(labels)["group"].endswith("fleetpulse-sink"))
        if lagging and "fired_after_stop_s" not in self.facts:
            self.facts["fired_after_stop_s"] = round(t - self.facts["stopped_at_s"], 1)
        if not lagging and "fired_after_stop_s" in self.facts and "resumed_at_s" in self.facts \
                and "resolved_after_resume_s" not in self.facts:
            self.facts["resolved_after_resume_s"] = round(t - self.facts["resumed_at_s"], 1)


def summary(args, rounds: list[dict], up: dict, drains: list[list[float]], report_s: float, report_rc: int) -> dict:
    """`drains`: [seconds into the run, XID -> drain seconds] per drain request."""
    cut = rounds[-1]["t_s"] / 4 if rounds else 0.0
    late = [r for r in rounds if r["t_s"] >= cut]
    names = sorted({k for r in rounds for k in r["lag_s"]})
    memory = {}
    for name in sorted({p for r in late for p in r["processes"]}):
        rss = [(r["t_s"], r["processes"][name]["rss_mb"]) for r in late if name in r["processes"]]
        cores = [r["processes"][name]["cores"] for r in late if name in r["processes"]]
        if len(rss) >= 2:
            (t0, first), (t1, last) = rss[0], rss[-1]
            mbs = [m for _, m in rss]
            slope = statistics.linear_regression([t for t, _ in rss], mbs).slope
            tenth = max(1, len(mbs) // 10)  # a process that swings (a store merging) is judged by its floor too
            quarter = max(1, len(mbs) // 4)  # ... and its peaks: the highest of the last quarter against the first
            memory[name] = {"rss_mb_first": first, "rss_mb_last": last, "rss_mb_min": min(mbs), "rss_mb_max": max(mbs),
                            "growth_pct": round(100 * (last - first) / max(first, 1e-9), 1),
                            # the least-squares trend over the window, as a share of its median
                            "trend_pct": round(100 * slope * (t1 - t0) / max(statistics.median(mbs), 1e-9), 1),
                            "floor_growth_pct": round(100 * (min(mbs[-tenth:]) / max(min(mbs[:tenth]), 1e-9) - 1), 1),
                            "peak_growth_pct": round(100 * (max(mbs[-quarter:]) / max(max(mbs[:quarter]), 1e-9) - 1),
                                                     1),
                            "mb_per_hour": round(slope * 3600, 1),
                            "cores_median": round(statistics.median(cores), 2)}
    samples_per_s = args.hosts / 10
    for m in memory.values():
        m["cpu_us_per_host_sample"] = round(1e6 * m["cores_median"] / samples_per_s, 1)
    final = up.get("final") or {}
    sent = (up.get("simulator") or {})
    first, end = (late[0], late[-1]) if late else ({}, {})
    span_h = max(end.get("t_s", 0) - first.get("t_s", 0), 1) / 3600

    def per_day(key: str) -> float:  # growth over the last three quarters, not the services' fixed start-up bytes
        return round((end.get(key, 0) - first.get(key, 0)) / span_h * 24 / 1e9, 2)

    held = next((r["state_entries"] for r in reversed(rounds) if r.get("state_entries")), {})  # before the stop
    pages = [r["page"] for r in rounds if r.get("page")]
    return {"hosts": args.hosts, "gpus": 8 * args.hosts, "minutes": args.minutes, "interval_s": 10,
            "lag_s": {n: quantiles([r["lag_s"][n] for r in rounds if n in r["lag_s"]]) for n in names},
            # without the first quarter: start-up (topics made, the first rebalance, a cold store) is a backlog too
            "lag_s_last_three_quarters": {n: quantiles([r["lag_s"][n] for r in late if n in r["lag_s"]])
                                          for n in names},
            "xid_to_drain_s": quantiles([s for _, s in drains]),
            "xid_to_drain_s_last_three_quarters": quantiles([s for t, s in drains if t >= cut]),
            "drains": drains,
            "processes_last_three_quarters": memory,
            "disk": {"broker_bytes": end.get("broker_bytes"), "store_bytes": end.get("store_bytes"),
                     "changelog_bytes": end.get("changelog_bytes"), "broker_gb_per_day": per_day("broker_bytes"),
                     "store_gb_per_day": per_day("store_bytes"), "changelog_gb_per_day": per_day("changelog_bytes")},
            "state_entries": held,
            "state_entries_per_host": {k: round(v / args.hosts, 2) for k, v in held.items()},
            "page_answer_s": {k: quantiles([p[k] for p in pages if p.get(k) is not None])
                              for k in ("outcomes_s", "gpu_temperature_s")},
            "report_s": report_s, "report_rc": report_rc,
            "sent": {k: v for k, v in sent.items() if isinstance(v, int)}, "stored_rows": final.get("rows"),
            "dead_letters": final.get("dead_letters"), "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=12_500, help="simulated hosts, 8 GPUs each")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=float, default=20.0, help="seconds between measurements")
    p.add_argument("--page-every", type=int, default=6, help="ask the page every N measurements")
    p.add_argument("--stop-sink-at", type=float, metavar="MIN", help="SIGSTOP the sink this many minutes in ...")
    p.add_argument("--stop-sink-for", type=float, default=180.0, metavar="S", help="... for this long (default 180 s), "
                   "and say when PipelineLagging fired and resolved")
    p.add_argument("--port", type=int, default=12092, help="first of the run's ports (broker; the rest above it): "
                   "below the kernel's ephemeral range, where an outgoing connection may hold one")
    p.add_argument("--data", type=Path, default=Path("/tmp/fleetpulse-fleet-scale"),
                   help="the run's data directory (emptied first by `up`)")
    p.add_argument("--out", type=Path, default=Path("bench/results/fleet_scale.json"))
    p.add_argument("--summarize", type=Path, metavar="JSON", help="recompute the summary of an earlier run's --out "
                   "from its rounds (its up result, and its XID -> drain times where it has no drains list, are kept)")
    args = p.parse_args()
    if args.summarize:
        before = json.loads(args.summarize.read_text())
        args.hosts, args.minutes = before["hosts"], before["minutes"]
        up = {"final": {"rows": before["stored_rows"], "dead_letters": before["dead_letters"]},
              "simulator": before["sent"]}
        out = {**before, **summary(args, before["rounds"], up, before.get("drains", []), before["report_s"],
                                   before["report_rc"])}
        if "drains" not in before:
            out["xid_to_drain_s"] = before["xid_to_drain_s"]
            del out["xid_to_drain_s_last_three_quarters"], out["drains"]
    else:
        out = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))


if __name__ == "__main__":
    main()
