"""The Slurm bot's actions, through Slurm's own commands: drain, repair (reboot or a configured command), validate
(DCGM diagnostics, an nccl-tests run), undrain, replace. Each action records its steps as it takes them, so a bot
restarted mid-action resumes it: a drain or reboot already issued is waited for, not issued again; a repair or check
command cut off by the restart is answered failed rather than run twice (the lifecycle re-sends a failed request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from bots.commands import Commands, run
from bots.runner import Outcome, Steps
from bots.slurm.config import SlurmBotConfig
from bots.slurm.nodes import NODE_NAME, SlurmNode, drain_reason, parse_show_node

log = logging.getLogger(__name__)


class SlurmError(RuntimeError):
    """scontrol or squeue refused; the text is theirs."""


class SlurmExecutor:
    def __init__(self, config: SlurmBotConfig, clock: Callable[[], float] = time.time):
        self.config = config
        self.clock = clock
        self.commands = Commands(config, clock)
        self._known: dict[str, tuple[bool, float]] = {}
        scontrol = Path(config.scontrol)
        self._squeue = str(scontrol.with_name("squeue")) if scontrol.parent != Path(".") else "squeue"

    # -- Slurm ------------------------------------------------------------------------------------------------

    async def _scontrol(self, *args: str) -> str:
        rc, out = await run([self.config.scontrol, *args], 60)
        if rc != 0:
            raise SlurmError(f"scontrol {' '.join(args[:3])}: {out.strip() or f'exit {rc}'}")
        return out

    async def node(self, name: str) -> SlurmNode | None:
        """The node called exactly `name` (None when Slurm knows none); SlurmError when Slurm does not answer."""
        if not NODE_NAME.fullmatch(name):
            return None
        rc, out = await run([self.config.scontrol, "-o", "show", "node", name], 60)
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
        rc, out = await run([self._squeue, "-h", "-w", name, "-t", "CONFIGURING,RUNNING,COMPLETING", "-o",
                                   "%A"], 60)
        if rc != 0:
            raise SlurmError(f"squeue -w {name}: {out.strip()}")
        return out.split()

    async def cluster_id(self) -> str:
        """The cluster's name (slurm.conf ClusterName), for the bot's consumer group: each cluster's bot reads every
        request in a group of its own."""
        out = await self._scontrol("show", "config")
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "ClusterName" and value.strip():
                return value.strip()
        raise SlurmError("scontrol show config names no ClusterName")

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
        kind = self.commands.repair_kind(event)
        if kind == "reboot" and "reboot" not in self.config.repair_commands:
            return await self._reboot(event, name, node, steps)
        return await self.commands.repair(kind, event, name, steps)

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
                    rc, out = await run([self.config.scontrol, "requeue", job], 60)
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
        return await self.commands.validate(event, name, steps)

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


def _state(node: SlurmNode) -> str:
    return "+".join([node.state, *sorted(node.flags)])
