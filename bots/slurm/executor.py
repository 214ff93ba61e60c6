"""The Slurm bot's actions, through Slurm's own commands: drain, repair (reboot or a configured command), validate
(DCGM diagnostics, an nccl-tests run), undrain, replace. Each action records its steps as it takes them, so a bot
restarted mid-action resumes it: a drain or reboot already issued is waited for, not issued again; a repair or check
command cut off by the restart is answered failed rather than run twice (the lifecycle re-sends a failed request).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from bots.runner import Outcome, Steps
from bots.slurm.config import SlurmBotConfig
from bots.slurm.nodes import NODE_NAME, SlurmNode, drain_reason, parse_show_node
from schemas.nccl_tests import parse_nccl_tests_run

log = logging.getLogger(__name__)
_TAIL = 400  # characters of a failed command's output kept in the answer
_KEPT = 4000  # characters of a command's output kept in the ledger
_PR_SET_PDEATHSIG = 1


def _die_with_the_bot() -> None:
    """In the command's process before exec: killed when the bot dies, even by SIGKILL, so a restarted bot never
    runs a check or repair beside one its previous life left behind (Linux; elsewhere the command outlives it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class SlurmError(RuntimeError):
    """scontrol or squeue refused; the text is theirs."""


class SlurmExecutor:
    def __init__(self, config: SlurmBotConfig, clock: Callable[[], float] = time.time):
        self.config = config
        self.clock = clock
        self._known: dict[str, tuple[bool, float]] = {}
        scontrol = Path(config.scontrol)
        self._squeue = str(scontrol.with_name("squeue")) if scontrol.parent != Path(".") else "squeue"

    # -- Slurm ------------------------------------------------------------------------------------------------

    async def _run(self, argv: list[str], timeout: float) -> tuple[int | None, str]:
        """Run a command in its own process group: exit status (None: killed at the timeout) and its output."""
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                                                    start_new_session=True, preexec_fn=_die_with_the_bot)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
            return proc.returncode, out.decode(errors="replace")
        except asyncio.TimeoutError:
            return None, f"killed after {timeout:g} s"
        finally:
            if proc.returncode is None:  # timed out, or the bot is stopping: the command goes with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()

    async def _scontrol(self, *args: str) -> str:
        rc, out = await self._run([self.config.scontrol, *args], 60)
        if rc != 0:
            raise SlurmError(f"scontrol {' '.join(args[:3])}: {out.strip() or f'exit {rc}'}")
        return out

    async def node(self, name: str) -> SlurmNode | None:
        """The node called exactly `name` (None when Slurm knows none); SlurmError when Slurm does not answer."""
        if not NODE_NAME.fullmatch(name):
            return None
        rc, out = await self._run([self.config.scontrol, "-o", "show", "node", name], 60)
        if rc != 0 and "not found" in out:
            return None
        if rc != 0 or not out.strip():
            raise SlurmError(f"scontrol show node {name}: {out.strip() or f'exit {rc}'}")
        try:
            node = parse_show_node(out.strip().splitlines()[0])
        except ValueError as exc:
            raise SlurmError(str(exc)) from None
        return node if node.name == name else None

    async def _jobs_on(self, name: str) -> list[str]:
        rc, out = await self._run([self._squeue, "-h", "-w", name, "-t", "CONFIGURING,RUNNING,COMPLETING", "-o",
                                   "%A"], 60)
        if rc != 0:
            raise SlurmError(f"squeue -w {name}: {out.strip()}")
        return out.split()

    async def serves(self, host: str) -> bool:
        """A host Slurm knows (as its NodeName, or node_names' mapping); answers are kept a minute. SlurmError when
        Slurm does not answer: the runner waits for it rather than guess."""
        known, at = self._known.get(host, (False, -1e18))
        if self.clock() - at > 60:
            known = await self.node(self.config.node_of(host)) is not None
            self._known[host] = (known, self.clock())
        return known

    async def _wait(self, name: str, done: Callable[[SlurmNode], bool], deadline: float) -> SlurmNode | None:
        """Poll the node until `done` holds (that node) or the deadline passes (None). A poll Slurm does not answer
        (slurmctld restarting) is tried again: only the deadline fails a wait."""
        while True:
            try:
                node = await self.node(name)
                if node is None or done(node):
                    return node
            except SlurmError as exc:
                log.warning("%s: %s (polling on)", name, exc)
            if self.clock() >= deadline:
                return None
            await asyncio.sleep(self.config.poll_s)

    # -- actions ----------------------------------------------------------------------------------------------

    async def act(self, event: dict, steps: Steps) -> Outcome:
        name = self.config.node_of(event["host"])
        node = await self.node(name)
        if node is None:
            return Outcome(False, f"Slurm no longer knows node {name}")
        action = event["action"]
        if action == "drain":
            return await self._drain(event, name, node, steps)
        if action == "undrain":
            return await self._undrain(name, node, steps)
        if node.out_of_service and not node.ours:
            return Outcome(False, f"{action} not done: node {name} is out of service by someone else ({node.owner})")
        if not node.out_of_service:
            return Outcome(False, f"{action} not done: node {name} is in service ({node.state}); drain it first")
        if action == "validate":
            return await self._validate(event, name, node, steps)
        kind = "replace" if action == "replace" else (event.get("evidence") or {}).get("repair") or "inspect"
        if kind == "reboot" and "reboot" not in self.config.repair_commands:
            return await self._reboot(event, name, node, steps)
        argv = self.config.repair_commands.get(kind)
        if argv is None:
            return Outcome(False, f"no command for repair {kind!r}: set FLEETPULSE_BOT_SLURM repair_commands.{kind}")
        rc, out = await self._command(f"repair:{kind}", argv, event, name, steps)
        return Outcome(rc == 0, f"{kind}: {' '.join(self._argv(argv, event, name))} -> " + _said(rc, out))

    async def _drain(self, event: dict, name: str, node: SlurmNode, steps: Steps) -> Outcome:
        if not steps.done("marked"):
            if node.out_of_service and not node.ours:
                return Outcome(True, f"already out of service, not claimed by fleetpulse: {node.owner}")
            reason = drain_reason(event)
            if node.event_id != event["event_id"]:  # else marked just before a restart, not recorded: not again
                await self._scontrol("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")
            steps.record("marked", reason=reason, at=self.clock())
        notes = []
        mode = (event.get("evidence") or {}).get("mode")
        if mode == "immediate" and self.config.requeue_immediate:
            if (requeued := steps.done("requeued")) is None:
                requeued = {"jobs": [], "refused": []}
                for job in await self._jobs_on(name):
                    rc, out = await self._run([self.config.scontrol, "requeue", job], 60)
                    requeued["jobs" if rc == 0 else "refused"].append(job if rc == 0 else f"{job} ({out.strip()})")
                steps.record("requeued", **requeued)
            if requeued["jobs"] or requeued["refused"]:
                notes.append(f"requeued {requeued['jobs']}" + (f", not requeued {requeued['refused']}"
                                                               if requeued["refused"] else ""))
        deadline = steps.done("marked")["at"] + self.config.drain_timeout_s
        settled = await self._wait(name, lambda n: n.drained or not n.out_of_service, deadline)
        if settled is None:
            jobs = await self._jobs_on(name)
            return Outcome(False, f"still running jobs {jobs} after {self.config.drain_timeout_s:g} s (DRAINING)")
        if not settled.out_of_service:
            return Outcome(False, f"node {name} was returned to service by someone else before it drained")
        return Outcome(True, "; ".join([f"{name} drained ({_state(settled)})", *notes]))

    async def _reboot(self, event: dict, name: str, node: SlurmNode, steps: Steps) -> Outcome:
        if (issued := steps.done("reboot_issued")) is None:
            if node.event_id == event["event_id"]:  # issued just before a restart, not recorded: never twice
                issued = {"boot_time": None, "at": self.clock()}
            else:
                await self._scontrol("reboot", "ASAP", "nextstate=DOWN", f"reason={drain_reason(event)}", name)
                issued = {"boot_time": node.boot_time, "at": self.clock()}
            steps.record("reboot_issued", **issued)

        def back(n: SlurmNode) -> bool:  # a boot time unknown (see above): back once no reboot flag is left
            return "reboot timed out" in n.reason or (not n.rebooting and n.responding
                                                      and n.boot_time != issued["boot_time"])

        settled = await self._wait(name, back, issued["at"] + self.config.reboot_timeout_s)
        if settled is None or "reboot timed out" in settled.reason:
            return Outcome(False, f"reboot of {name} not complete after {self.config.reboot_timeout_s:g} s"
                           + (f" ({settled.reason})" if settled else ""))
        return Outcome(True, f"{name} rebooted (boot {issued['boot_time']} -> {settled.boot_time}), "
                             f"{_state(settled)}")

    async def _validate(self, event: dict, name: str, node: SlurmNode, steps: Steps) -> Outcome:
        if node.rebooting or not node.responding:
            return Outcome(False, f"{name} cannot be validated: {_state(node)}")
        need = event.get("requirements") or {}
        findings, measurements, ok = [], {}, True
        if "dcgm_diag_level" in need:
            level = int(need["dcgm_diag_level"])
            if self.config.dcgm_diag_command is None:
                ok = False
                findings.append(f"dcgm_diag_level {level} required and no dcgm_diag_command configured")
            else:
                rc, out = await self._command("check:dcgm", self.config.dcgm_diag_command, event, name, steps,
                                              level=level)
                ok &= rc == 0
                findings.append(f"dcgm diag -r {level}: " + ("pass" if rc == 0 else _said(rc, out)))
                if rc == 0:
                    measurements["dcgm_diag_level"] = float(level)
        if self.config.nccl_command is not None:
            rc, out = await self._command("check:nccl", self.config.nccl_command, event, name, steps)
            run = parse_nccl_tests_run(out)
            busbw = run.avg_busbw_gbs
            if busbw is not None and rc == 0:
                measurements["nccl_busbw_gbs"] = busbw
            want = need.get("nccl_busbw_min_gbs")
            passed = rc == 0 and busbw is not None and run.check_ok is not False and not run.out_of_bounds \
                and (want is None or busbw >= want)
            ok &= passed
            findings.append(f"nccl busbw {busbw} GB/s" + (f" (>= {want:g} required)" if want is not None else "")
                            + ("" if passed else f": failed, {_said(rc, out)}"))
        elif "nccl_busbw_min_gbs" in need:
            ok = False
            findings.append(f"nccl_busbw_min_gbs {need['nccl_busbw_min_gbs']:g} required and no nccl_command "
                            "configured")
        return Outcome(ok, "; ".join(findings) or "nothing to check", measurements)

    async def _undrain(self, name: str, node: SlurmNode, steps: Steps) -> Outcome:
        if not steps.done("resumed"):
            if not node.out_of_service:
                return Outcome(True, f"{name} already in service ({_state(node)})")
            if not node.ours:
                return Outcome(False, f"left out of service: not drained by fleetpulse ({node.owner})")
            await self._scontrol("update", f"NodeName={name}", "State=RESUME")
            steps.record("resumed", at=self.clock())
        # slurmctld marks a node it has not pinged since it was down NOT_RESPONDING for a moment after RESUME: the
        # node is returned once Slurm would schedule on it.
        deadline = steps.done("resumed")["at"] + self.config.resume_timeout_s
        node = await self._wait(name, lambda n: not n.out_of_service and n.responding, deadline)
        if node is None:
            node = await self.node(name)
            return Outcome(False, f"RESUME sent but {name} is not schedulable after {self.config.resume_timeout_s:g} s"
                                  f" ({_state(node) if node else 'gone'}{': ' + node.reason if node else ''})")
        return Outcome(True, f"{name} resumed ({_state(node)})")

    # -- commands ---------------------------------------------------------------------------------------------

    def _argv(self, argv: list[str], event: dict, name: str, level: int | str = "") -> list[str]:
        evidence = event.get("evidence") or {}
        values = {"node": name, "host": event["host"], "event_id": event["event_id"], "level": str(level),
                  "gpu": str(evidence.get("gpu_index", ""))}
        return [arg.format(**values) for arg in argv]

    async def _command(self, step: str, argv: list[str], event: dict, name: str, steps: Steps,
                       level: int | str = "") -> tuple[int | None, str]:
        """Run a configured command once per event: its outcome is recorded, and a run a restart cut off is not
        started again (it is answered as failed, and the lifecycle decides whether to ask again)."""
        if (finished := steps.done(step + ":finished")) is not None:
            return finished["rc"], finished["output"]
        started = steps.done(step + ":started")
        if started is not None and not started.get("stopped"):
            return -1, "interrupted by a restart of the bot while running; not run again"
        steps.record(step + ":started", at=self.clock())
        try:
            rc, out = await self._run(self._argv(argv, event, name, level), self.config.command_timeout_s)
        except asyncio.CancelledError:  # the bot is stopping and _run killed the command: it may run again
            steps.record(step + ":started", at=self.clock(), stopped=True)
            raise
        steps.record(step + ":finished", rc=rc, output=out[-_KEPT:])
        return rc, out


def _state(node: SlurmNode) -> str:
    return "+".join([node.state, *sorted(node.flags)])


def _said(rc: int | None, out: str) -> str:
    status = "killed at its timeout" if rc is None else f"exit {rc}"
    tail = out.strip()[-_TAIL:]
    return f"{status}: {tail}" if tail else status
