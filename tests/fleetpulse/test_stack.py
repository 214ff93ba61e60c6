"""`fleetpulse up` as a user runs it on a fresh machine: it starts the local ClickHouse server, which a plain HTTP
client reads while the run goes on; every simulated GPU row lands once, the demo's faults raise alerts, a drain and a
return, stragglers are flagged, the fleet page it serves shows them in real headless Chromium (Debian's `chromium`,
driven by Playwright), and query answers afterwards from the same store."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from tests.conftest import free_ports, require_system

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_runs_the_stack_and_leaves_exactly_what_was_simulated(tmp_path, request):
    require_system("the fleet page's browser test", "chromium", "chromium", "chromium-browser", "google-chrome")
    http_port = free_ports(2)
    tcp_port = http_port + 1
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLEETPULSE_", "CLICKHOUSE", "KAFKA_"))},
        "FLEETPULSE_LOCAL_KAFKA_PORT": str(free_ports(2)),
        "FLEETPULSE_DATA_DIR": str(tmp_path / "data"),
        "FLEETPULSE_SINK_PORT": str(free_port()),
        "FLEETPULSE_PAGE_PORT": str(free_port()),
        "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT": str(http_port),
        "FLEETPULSE_LOCAL_CLICKHOUSE_TCP_PORT": str(tcp_port),
    }  # no broker or store named: up starts the local ones, as on a fresh machine
    cli = [sys.executable, "-m", "fleetpulse.cli"]
    # the default scenario (demo), 180 simulated seconds six times faster than real time
    shot = tmp_path / "page.png"
    out_file, err_file = open(tmp_path / "up.out", "w+"), open(tmp_path / "up.err", "w+")
    running = subprocess.Popen(cli + ["up", "--hosts", "8", "--speed", "6", "--plain", "--json", "--screenshot",
                                      str(shot)],
                               env=env, stdout=out_file, stderr=err_file, text=True)
    # While it runs, any ClickHouse client reads the store: here a plain HTTP GET as the analyst, as curl sends it.
    password = tmp_path / "data" / "clickhouse" / "passwords" / "analyst"
    request.addfinalizer(lambda: running.poll() is None and (running.terminate(), running.wait(60)))
    seen, deadline = [], time.monotonic() + 240
    while running.poll() is None and time.monotonic() < deadline:
        if password.exists():
            url = (f"http://127.0.0.1:{http_port}/?user=fleetpulse_analyst&password="
                   f"{quote(password.read_text().strip())}&query=SELECT+count()+FROM+gpu_samples")
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    seen.append(int(answer.read()))
            except urllib.error.HTTPError as exc:  # a refusal fails; a table the sink has not made yet does not
                if exc.code != 404:
                    pytest.fail(f"the store refused the analyst: {exc.read()!r}")
            except OSError:
                pass
        time.sleep(1.0)
    running.wait(timeout=300)
    up = subprocess.CompletedProcess(running.args, running.returncode, (tmp_path / "up.out").read_text(),
                                     (tmp_path / "up.err").read_text())
    assert up.returncode == 0, up.stderr[-3000:]
    assert seen and max(seen) > 0 and seen == sorted(seen), seen  # the rows so far, growing
    assert f"the store is the ClickHouse server on http://127.0.0.1:{http_port} (started for this run)" in up.stderr
    assert "stopped the ClickHouse server it started" in up.stderr
    assert "up: every consumer reads (" in up.stderr  # the fleet started once the sink and workers held partitions
    result = json.loads(up.stdout)
    sim, final = result["simulator"], result["final"]
    assert sim["scenario"] == "demo" and sim["ticks"] == 180 and sim["gpu_readings"] == 8 * 8 * 180
    assert final["rows"]["gpu_samples"] == sim["gpu_readings"]  # the view counts what the store holds
    assert final["store"].startswith("taking writes"), final["store"]
    # something happens: the overheating GPU alerts, the Xid 119 node is drained, repaired, validated and returned
    # by the simulated bot (drain, repair, validate, undrain), both slow ranks are flagged; the view says so
    assert final["alerts_firing"] >= 2 and final["interruptions"] == 1, final
    assert final["drains"] == 1 and final["returns"] == 1 and result["bot_answers"] == 4, result
    assert final["stragglers"] == 2, final
    assert "node       gpu-node-0001 validating -> healthy: validation passed" in up.stderr
    assert "straggler  job-0000 rank 37 on gpu-node-0004" in up.stderr

    # the server up started is stopped with it; its rows stay, served again by `fleetpulse clickhouse start`
    assert subprocess.run(cli + ["clickhouse", "status"], env=env, capture_output=True).returncode == 1
    started = subprocess.run(cli + ["clickhouse", "start"], env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    request.addfinalizer(lambda: subprocess.run(cli + ["clickhouse", "stop"], env=env, capture_output=True))

    def ask(sql: str) -> str:
        done = subprocess.run(cli + ["query", sql], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert ask("SELECT count(), uniqExact(ts), count() / uniqExact(ts) FROM gpu_samples") == "11520\t180\t64\n"

    # the fleet page `up` served, loaded in real headless Chromium at the end of the run: every panel drew from the
    # run's store without a console error, and shows its real numbers
    page = result["screenshot"]
    assert result["page"] == f"http://127.0.0.1:{env['FLEETPULSE_PAGE_PORT']}/" and "fleet page is on" in up.stderr
    assert page["console_errors"] == [], page["console_errors"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    rows, text = page["rows"], page["text"]
    from fleetpulse.panels import PANELS

    assert set(rows) == {p.name for p in PANELS} | {"outcomes"} and all(n > 0 for n in rows.values()), rows
    assert rows["drains"] == int(ask("SELECT uniqExact(event_id) FROM drain_events")) == 4
    assert rows["gpu_heatmap"] == 64 and rows["alerts"] == int(ask("SELECT uniqExact(fingerprint, starts_at) "
                                                                   "FROM alerts"))
    assert "gpu-node-0001" in text["drains"] and "validation passed" in text["drains"]
    assert "GPU-hours at stake" in text["drains"]  # what the drain cost (its job, when the lifecycle knew it yet)
    assert "closed" in text["breaker"] and "job-0000" in text["stragglers"] and "gpu-node-0004" in text["stragglers"]
    assert "GpuTempSlowdown" in text["alerts"] and "119" in text["top_xids"]
    # the incident timeline shows the drain (0001), the thermal page (0000) and the straggler (0004) as marks on the
    # run's time axis, each its own lane
    assert all(host in text["incidents"] for host in ("gpu-node-0000", "gpu-node-0001", "gpu-node-0004"))

    # One source for every figure: `up`'s summary, `fleetpulse report` after it and the page over its range agree.
    def report(*flags: str) -> dict:
        done = subprocess.run(cli + ["report", "--json", *flags], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    def figures(r: dict) -> tuple:
        return (r["usable_compute"]["gpu_weighted"], r["usable_compute"]["minutes"], r["interruptions"]["total"],
                r["drains"]["requested"], r["drains"]["returned"], r["stragglers"]["job_seconds_lost"],
                r["alerts"]["pages"])

    ours, shown = report(), page["outcomes"]
    iso = [time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t / 1000)) + f".{t % 1000:03d}"
           for t in (page["range"]["from"], page["range"]["to"])]
    assert figures(result["outcomes"]) == figures(ours), (result["outcomes"], ours)
    ranged = report("--from", iso[0], "--to", iso[1])
    assert figures(shown) == figures(ranged) == figures(ours), json.dumps([shown, ranged, ours])
    usable, minutes, interruptions, drains, returned, _, _ = figures(ours)
    assert (interruptions, drains, returned) == (1, 1, 1)  # Xid 119 with its Xid 154: one interruption
    assert minutes >= 3 and 0.9 < usable < 1.0  # the drained node's minutes are in, the last one too (closed at stop)
    assert f"{usable * 100:.1f} %" in text["outcomes"] and f"{usable * 100:.1f} %" in up_summary(result)

    # A second run starts from zero: the first one's broker data, rows and logs are removed before it starts (its
    # summary of a screen on stdout, the whole result in a file).
    assert subprocess.run(cli + ["clickhouse", "stop"], env=env, capture_output=True).returncode == 0
    again = subprocess.run(cli + ["up", "--hosts", "4", "--duration", "20", "--speed", "0", "--scenario", "baseline",
                                  "--plain"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "up: a fresh run: removed the last run's data in " in again.stderr
    whole = json.loads((tmp_path / "data" / "up.json").read_text())
    assert whole["final"]["rows"]["gpu_samples"] == whole["simulator"]["gpu_readings"] == 4 * 8 * 20
    assert whole["final"]["interruptions"] == whole["final"]["drains"] == 0  # none of the first run's
    lines = again.stdout.splitlines()
    assert lines[0].startswith("fleetpulse up: baseline, 4 hosts, 20 ticks published (640 GPU readings); 640 GPU rows")
    assert len(lines) <= 15 and lines[-1].startswith(f"whole result: {tmp_path / 'data' / 'up.json'}")


def up_summary(result: dict) -> str:
    import argparse

    from fleetpulse.stack import summary

    return "\n".join(summary(result, argparse.Namespace(scenario="demo", hosts=8)))


def test_up_plays_the_demo_by_default_and_baseline_injects_nothing():
    import argparse

    from agents.simulator.scenario import load_scenario
    from fleetpulse.stack import configure_parser

    p = argparse.ArgumentParser()
    configure_parser(p)
    args = p.parse_args([])
    assert args.scenario == "demo" and args.duration is None  # the scenario's own 180 s
    assert [f.kind for f in load_scenario("demo").faults] == ["thermal_runaway", "xid", "slow_rank"]
    baseline = load_scenario("baseline")
    assert baseline.faults == [] and baseline.generate == [] and baseline.bot == {}
