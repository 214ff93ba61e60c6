"""A real Slurm cluster on this machine for the bot's tests: munged, slurmctld and one slurmd per node (`slurmd -N`),
all under one temporary directory, on free ports, stopped at the end. Nodes are declared with this machine's host
name and loopback address. Their RebootProgram "reboots" a node by restarting its slurmd with `-b` (report a fresh
boot), so `scontrol reboot` runs its whole course: REBOOT_ISSUED, the node back with a new boot time.

Needs Debian's slurmctld, slurmd, slurm-client and munge packages (.ci/run installs them; elsewhere the tests that need
them are skipped with the line that installs them).
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue")
PACKAGES = "slurmctld slurmd slurm-client munge"

REBOOT = """#!/bin/sh
# The test cluster's RebootProgram: restarts the slurmd that ran it with -b (a fresh boot). The node is the one in the
# nearest slurmd ancestor's command line (-N NAME).
pid=$$ node=
while [ "$pid" -gt 1 ] && [ -z "$node" ]; do
  pid=$(awk '/^PPid:/ {print $2}' /proc/$pid/status)
  node=$(tr '\\0' ' ' < /proc/$pid/cmdline | sed -n 's/^slurmd .*-N \\([^ ]*\\).*/\\1/p')
done
echo "$(date +%s) $node" >> "$(dirname "$0")/reboots.log"
[ -n "$node" ] || exit 1
( sleep 1; kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  exec setsid slurmd -b -N "$node" ) >/dev/null 2>&1 </dev/null &
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


class SlurmCluster:
    def __init__(self, root: Path, nodes: list[str], base_port: int):
        self.root, self.nodes, self.base_port = root, nodes, base_port
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        r, user, host = self.root, getpass.getuser(), socket.gethostname().split(".")[0]
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        reboot = r / "reboot.sh"
        reboot.write_text(REBOOT)
        reboot.chmod(0o755)
        lines = [
            "ClusterName=fleetpulse-test", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmUser={user}",
            f"SlurmdUser={user}", f"SlurmctldPort={self.base_port}", f"SlurmdPort={self.base_port + 1}",
            "AuthType=auth/munge", f"AuthInfo=socket={r}/munge/sock", "CryptoType=crypto/munge",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n", f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.%n.pid", f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.%n.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SwitchType=switch/none", "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            f"RebootProgram={reboot}", "ResumeTimeout=60", "SlurmdTimeout=30", "MinJobAge=2",
        ]
        for k, node in enumerate(self.nodes):
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.base_port + 2 + k} "
                         "CPUs=1 State=UNKNOWN")
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, *argv: str) -> None:
        subprocess.run(argv, env=self.env, check=True, timeout=30, capture_output=True)

    def start(self) -> SlurmCluster:
        self._write()
        m = self.root / "munge"
        self._daemon("munged", "-f", f"--key-file={m}/munge.key", f"--socket={m}/sock", f"--pid-file={m}/pid",
                     f"--log-file={m}/log", f"--seed-file={m}/seed")
        self._daemon("slurmctld", "-i")
        for node in self.nodes:
            self._daemon("slurmd", "-N", node)
        self.wait_until(lambda: all(self.state(n) == "IDLE" for n in self.nodes), 60, "every node idle")
        return self

    def stop(self) -> None:
        pids = [self.root / "munge" / "pid", self.root / "slurmctld.pid",
                *(self.root / f"slurmd.{n}.pid" for n in self.nodes)]
        running = []
        for pid_file in pids:
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, signal.SIGTERM)
                running.append(pid)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 10
        while running and time.monotonic() < deadline:
            time.sleep(0.2)
            running = [pid for pid in running if _alive(pid)]
        for pid in running:
            os.kill(pid, signal.SIGKILL)

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stdout}{done.stderr}")
        return done.stdout

    def show(self, node: str) -> str:
        return self.run("scontrol", "-o", "show", "node", node).strip()

    def state(self, node: str) -> str:
        return self.show(node).split(" State=", 1)[1].split()[0]

    def reason(self, node: str) -> str:
        line = self.show(node)
        return line.split(" Reason=", 1)[1] if " Reason=" in line else ""

    def submit(self, node: str, seconds: float) -> str:
        """A batch job on `node` that runs for `seconds`; its id."""
        out = self.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", f"sleep {seconds}")
        job = out.strip().split(";")[0]
        self.wait_until(lambda: self.run("squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING", 30,
                        f"job {job} running on {node}")
        return job

    def reset(self) -> None:
        """Every node idle and in service, no job left: the state each test starts from."""
        self.run("scancel", "--partition=gpu", check=False)
        for node in self.nodes:
            self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.wait_until(lambda: all(self.state(n) == "IDLE" for n in self.nodes), 60, "every node idle again")

    def log_count(self, text: str) -> int:
        """How often slurmctld logged `text` (what a command did, counted where Slurm records it)."""
        return (self.root / "log" / "slurmctld.log").read_text(errors="replace").count(text)

    def reboots(self) -> list[str]:
        path = self.root / "reboots.log"
        return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []

    @staticmethod
    def wait_until(check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout:g} s: {what}")
            time.sleep(0.3)
