"""The commands a bot runs on a node, whatever its scheduler: a repair (a GPU reset, a ticket for a technician) and the
validation a request names (DCGM diagnostics at a level, an nccl-tests run). Each runs once per event: its outcome is
kept in the ledger, a command killed with the bot is never started twice by accident, and it dies with the bot.

The trays an NVLink domain's incident drained (their requests name `incident` and `incident_since`) share one repair:
`repair_commands.domain` runs once for the incident, on the first tray's request, and every tray's repair is answered
with its outcome; each tray is still validated on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable

from bots.config import BotConfig
from bots.runner import Outcome, Steps
from schemas.nccl_tests import parse_nccl_tests_run

TAIL = 400  # characters of a failed command's output kept in the answer
_KEPT = 4000  # characters of a command's output kept in the ledger
_PR_SET_PDEATHSIG = 1


def _die_with_the_bot() -> None:
    """In the command's process before exec: killed when the bot dies, even by SIGKILL, so a restarted bot never
    runs a check or repair beside one its previous life left behind (Linux; elsewhere the command outlives it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def run(argv: list[str], timeout: float) -> tuple[int | None, str]:
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


def said(rc: int | None, out: str) -> str:
    status = "killed at its timeout" if rc is None else f"exit {rc}"
    tail = out.strip()[-TAIL:]
    return f"{status}: {tail}" if tail else status


class Commands:
    """The configured commands of one bot, run for one event at a time."""

    def __init__(self, config: BotConfig, clock: Callable[[], float] = time.time):
        self.config, self.clock = config, clock
        self._shared: dict[tuple[str, str], asyncio.Future] = {}  # an incident's one repair, by (domain, since)

    def argv(self, argv: list[str], event: dict, node: str, level: int | str = "") -> list[str]:
        evidence = event.get("evidence") or {}
        values = {"node": node, "host": event["host"], "event_id": event["event_id"], "level": str(level),
                  "gpu": str(evidence.get("gpu_index", "")), "domain": str(evidence.get("incident", ""))}
        return [arg.format(**values) for arg in argv]

    def repair_kind(self, event: dict) -> str:
        """What to run for a repair request: replace for a replacement; the domain's shared repair for a tray its
        incident drained, when one is configured; else the tray's own repair (reset, reboot, inspect)."""
        evidence = event.get("evidence") or {}
        if event["action"] == "replace":
            return "replace"
        if evidence.get("incident") and "domain" in self.config.repair_commands:
            return "domain"
        return evidence.get("repair") or "inspect"

    async def once(self, step: str, argv: list[str], event: dict, node: str, steps: Steps,
                   level: int | str = "") -> tuple[int | None, str]:
        """Run a configured command once per event: its outcome is recorded, and a run the bot's death cut off is not
        started again (it is answered as failed, and the lifecycle decides whether to ask again); one a clean stop
        cut off runs again."""
        if (finished := steps.done(step + ":finished")) is not None:
            return finished["rc"], finished["output"]
        started = steps.done(step + ":started")
        if started is not None and not started.get("stopped"):
            return -1, "interrupted by a restart of the bot while running; not run again"
        steps.record(step + ":started", at=self.clock())
        try:
            rc, out = await run(self.argv(argv, event, node, level), self.config.command_timeout_s)
        except asyncio.CancelledError:  # the bot is stopping and run() killed the command: it may run again
            steps.record(step + ":started", at=self.clock(), stopped=True)
            raise
        steps.record(step + ":finished", rc=rc, output=out[-_KEPT:])
        return rc, out

    async def repair(self, kind: str, event: dict, node: str, steps: Steps) -> Outcome:
        """A repair (or replacement) by its configured command; a kind without one is answered failed, naming the
        setting to add."""
        argv = self.config.repair_commands.get(kind)
        if argv is None:
            return Outcome(False, f"no command for repair {kind!r}: set repair_commands.{kind} in the bot's settings")
        if kind == "domain":
            rc, out, ran_on = await self._domain(argv, event, node, steps)
            shared = "" if ran_on == event["event_id"] else f" (the incident's one repair, run on {ran_on})"
            return Outcome(rc == 0, f"domain {event['evidence']['incident']}: "
                                    f"{' '.join(self.argv(argv, event, node))} -> {said(rc, out)}{shared}")
        rc, out = await self.once(f"repair:{kind}", argv, event, node, steps)
        return Outcome(rc == 0, f"{kind}: {' '.join(self.argv(argv, event, node))} -> " + said(rc, out))

    async def _domain(self, argv: list[str], event: dict, node: str, steps: Steps) -> tuple[int | None, str, str]:
        """The incident's one repair (per attempt: a failed one is run again when the lifecycle asks again): run on the
        first tray's request, recorded in its ledger entry as any repair, and awaited by the other trays', each
        recording the outcome it was answered with. Returns the exit status, the output and the request it ran on."""
        if (shared := steps.done("repair:domain:shared")) is not None:
            return shared["rc"], shared["output"], shared["ran_on"]
        evidence = event["evidence"]
        key = (evidence["incident"], evidence.get("incident_since", ""), str(evidence.get("attempt", "")))
        outcome = self._shared.get(key)
        if outcome is None:
            outcome = self._shared[key] = asyncio.get_running_loop().create_future()
            try:
                rc, out = await self.once("repair:domain", argv, event, node, steps)
            except asyncio.CancelledError:  # the bot is stopping: a waiting tray's request runs it in its next life
                del self._shared[key]
                outcome.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - the command could not start: every tray is answered so
                outcome.set_result((-1, f"{type(exc).__name__}: {exc}", event["event_id"]))
            else:
                outcome.set_result((rc, out, event["event_id"]))
        rc, out, ran_on = await asyncio.shield(outcome)
        steps.record("repair:domain:shared", rc=rc, output=out[-_KEPT:], ran_on=ran_on)
        return rc, out, ran_on

    async def validate(self, event: dict, node: str, steps: Steps) -> Outcome:
        """The checks the request names: DCGM diagnostics at `dcgm_diag_level`, then the nccl-tests run when one is
        configured (its bandwidth against `nccl_busbw_min_gbs`); measurements carry what passed."""
        need = event.get("requirements") or {}
        findings, measurements, ok = [], {}, True
        if "dcgm_diag_level" in need:
            level = int(need["dcgm_diag_level"])
            if self.config.dcgm_diag_command is None:
                ok = False
                findings.append(f"dcgm_diag_level {level} required and no dcgm_diag_command configured")
            else:
                rc, out = await self.once("check:dcgm", self.config.dcgm_diag_command, event, node, steps, level=level)
                ok &= rc == 0
                findings.append(f"dcgm diag -r {level}: " + ("pass" if rc == 0 else said(rc, out)))
                if rc == 0:
                    measurements["dcgm_diag_level"] = float(level)
        if self.config.nccl_command is not None:
            rc, out = await self.once("check:nccl", self.config.nccl_command, event, node, steps)
            result = parse_nccl_tests_run(out)
            busbw = result.avg_busbw_gbs
            if busbw is not None and rc == 0:
                measurements["nccl_busbw_gbs"] = busbw
            want = need.get("nccl_busbw_min_gbs")
            passed = rc == 0 and busbw is not None and result.check_ok is not False and not result.out_of_bounds \
                and (want is None or busbw >= want)
            ok &= passed
            findings.append(f"nccl busbw {busbw} GB/s" + (f" (>= {want:g} required)" if want is not None else "")
                            + ("" if passed else f": failed, {said(rc, out)}"))
        elif "nccl_busbw_min_gbs" in need:
            ok = False
            findings.append(f"nccl_busbw_min_gbs {need['nccl_busbw_min_gbs']:g} required and no nccl_command "
                            "configured")
        return Outcome(ok, "; ".join(findings) or "nothing to check", measurements)
