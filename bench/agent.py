"""The host agent's cost: CPU per 8-GPU NVML poll, per 1,000 kernel-log lines, and the whole agent process.

    python bench/agent.py [--runs 5] [--out bench/results/agent.json]

Every figure is the median over --runs fresh subprocesses, so peak RSS (ru_maxrss) is one process's own. CPU is
time.process_time() (user + system, all threads) around the measured loop, after a warm-up; the fake NVML answers
from recorded readings of an 8x H100 host, so the poll figure is the agent's own work (the real driver adds its
ioctl time). `agent_process` runs the real agent (collectors, spooling publisher, metrics endpoint) with default
cadences for --agent-seconds against a broker that is away (KAFKA_BOOTSTRAP_SERVERS, when set, is used instead),
so it also pays for spooling every record to disk.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import save  # bench/report.py, beside this script

TARGETS = {"cpu_ms_per_8gpu_poll": 2.0, "peak_rss_mb": 80.0}
ORDINARY = [
    "[ 1203.104512] usb 1-1.2: new high-speed USB device number 5 using xhci_hcd",
    "[ 1203.220931] mlx5_core 0000:0c:00.0 ens1f0np0: Link up",
    "[ 1204.001200] audit: type=1400 audit(1717171717.123:412): apparmor=\"STATUS\" operation=\"profile_load\"",
    "[ 1204.551013] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "[ 1205.310777] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
    "[ 1206.902001] nvidia-nvswitch0: open (major=508)",
    "[ 1207.000321] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.90.07",
    "[ 1208.777777] systemd[1]: Started Session 12 of User slurm.",
]
XID = ("[ {t:.6f}] NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid={pid}, name=python3, Ch 0000000{ch}, "
       "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f4a_{pid:08x}")


def kernel_lines(kind: str, batch: int, n: int = 1000) -> list[str]:
    """mixed: 1 XID line in 20 among ordinary ones; storm: every line a new XID report (its own pid, so none is a
    repeat the collector folds); repeats: one XID line n times (the dedup path of a flood)."""
    out = []
    for i in range(n):
        xid = XID.format(t=1210 + i / 1000, bus=0x18 + (i % 8) * 0x10, code=(13, 31, 43, 79)[i % 4],
                         pid=4000 + batch * n + i, ch=i % 8)
        if kind == "repeats":
            out.append(XID.format(t=1210 + i / 1000, bus=0x18, code=13, pid=4000, ch=1))
        elif kind == "storm" or i % 20 == 0:
            out.append(xid)
        else:
            out.append(ORDINARY[i % len(ORDINARY)])
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child_nvml_poll(iterations: int) -> dict:
    from agents.nvml import NvmlCollector
    from agents.nvml.fake import FakeNvml

    collector = NvmlCollector(FakeNvml(), host="gpu-node-0001", rack="r01", cluster="bench")
    assert collector.is_supported() and len(collector.sample().sample.gpus) == 8  # warm-up: opens all 8 GPUs
    t0 = time.process_time()
    for _ in range(iterations):
        collector.sample()
    return {"cpu_ms": 1000 * (time.process_time() - t0) / iterations, "peak_rss_mb": peak_rss_mb()}


def child_kernel_log(kind: str, iterations: int) -> dict:
    from agents.kernel_log import KernelLogCollector, StaticSource

    batches, source = [kernel_lines(kind, b) for b in range(iterations + 1)], StaticSource()
    gpus = {f"0000:{0x18 + g * 0x10:02x}:00.0": g for g in range(8)}
    collector = KernelLogCollector(source, host="gpu-node-0001", gpu_index_by_pci=gpus)
    source.add(*batches[0])
    collector.sample()  # warm-up
    events, cpu = 0, []
    for lines in batches[1:]:
        t0 = time.process_time()
        source.add(*lines)
        events += len(collector.sample())
        cpu.append(time.process_time() - t0)
    # First and last batch apart: a cost that grows with what the collector has seen shows up here.
    return {"cpu_ms": 1000 * sum(cpu) / iterations, "cpu_ms_first_batch": 1000 * cpu[0],
            "cpu_ms_last_batch": 1000 * cpu[-1], "peak_rss_mb": peak_rss_mb(),
            "events_per_1000_lines": events / iterations}


def child_agent(seconds: float) -> dict:
    import asyncio

    from agents.cli import serve
    from agents.nvml.fake import FakeNvml
    from agents.settings import load_agent_settings

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kern.log").write_text("")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            away = f"127.0.0.1:{s.getsockname()[1]}"
        settings = load_agent_settings(agent_host="gpu-node-0001", data_dir=tmp, agent_metrics_port="off",
                                       agent_collectors="nvml,nvml_xid,kernel_log", agent_interval_s=1.0,
                                       agent_kernel_log=str(Path(tmp, "kern.log")), agent_shutdown_timeout_s=1,
                                       kafka_bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or away)

        async def run() -> tuple[float, float, int]:
            stop = asyncio.Event()
            task = asyncio.create_task(serve(settings, stop, nvml=FakeNvml()))
            await asyncio.sleep(1.5)  # start-up (imports, probes, producer connect attempt) is not steady state
            cpu, wall = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            stop.set()
            runner = await task
            return cpu, wall, runner.states["nvml"].polls

        cpu, wall, polls = asyncio.run(run())
    return {"cpu_ms": 1000 * cpu / (wall / settings.agent_interval_s), "cpu_percent": 100 * cpu / wall,
            "peak_rss_mb": peak_rss_mb(), "nvml_polls": polls}


def run_child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"bench child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]} | {"runs": len(runs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="fresh subprocesses per figure (median reported)")
    p.add_argument("--polls", type=int, default=300, help="8-GPU polls timed per subprocess")
    p.add_argument("--batches", type=int, default=20, help="batches of 1,000 kernel-log lines per subprocess")
    p.add_argument("--agent-seconds", type=float, default=10.0, help="steady-state seconds of the whole agent")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        name, arg = args.child[0], float(args.child[1])
        result = {"nvml_poll": lambda: child_nvml_poll(int(arg)), "agent": lambda: child_agent(arg)}.get(
            name, lambda: child_kernel_log(name, int(arg)))()
        print(json.dumps(result))
        return 0
    figures = {
        "nvml_poll_8gpu": median_of([run_child(["nvml_poll", str(args.polls)]) for _ in range(args.runs)]),
        **{f"kernel_log_{kind}_per_1000_lines": median_of([run_child([kind, str(args.batches)])
                                                           for _ in range(args.runs)])
           for kind in ("mixed", "storm", "repeats")},
        "agent_process": median_of([run_child(["agent", str(args.agent_seconds)]) for _ in range(args.runs)]),
    }
    worst_rss = max(f["peak_rss_mb"] for f in figures.values())
    report = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "targets": TARGETS, **figures,
        "meets_targets": {"cpu_ms_per_8gpu_poll": figures["nvml_poll_8gpu"]["cpu_ms"] < TARGETS["cpu_ms_per_8gpu_poll"],
                          "peak_rss_mb": worst_rss < TARGETS["peak_rss_mb"]},
    }
    save(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
