"""A simulated remediation bot: answers drain, repair, validate, undrain and replace requests on simulated time.

A real bot (Kubernetes cordon/drain, Slurm, a bare-metal repair queue) takes minutes to hours per request. This one
holds each answer until the simulator's clock reaches the request's time plus the action's delay, so the node
lifecycle sees the same order of events it would in production, only compressed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ConfigError
from schemas.analytics import RemediationResult

REPAIR_KINDS = ("reset", "reboot", "inspect", "replace", "domain")  # domain: an NVLink domain's shared part


class SimulatedBotConfig(BaseModel):
    """Simulated seconds each action takes [ours: a drain waits for jobs to checkpoint, a reboot plus burn-in takes
    ten minutes, an inspection half an hour, an NVLink domain's shared part (Fabric Manager restarted, NVSwitch trays
    re-initialised) a quarter of an hour, once for every tray its incident drained]; validation reports the bandwidth
    a healthy node measures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    drain_s: float = Field(default=60.0, ge=0)
    repair_s: dict[str, float] = Field(default_factory=lambda: {"reset": 120.0, "reboot": 600.0, "inspect": 1800.0,
                                                                "domain": 900.0})
    validate_s: float = Field(default=300.0, ge=0)
    replace_s: float = Field(default=3600.0, ge=0)
    undrain_s: float = Field(default=5.0, ge=0)
    busbw_gbs: float = Field(default=45.0, gt=0, description="all-reduce bus bandwidth a repaired node measures")

    def fix_s(self, repair: str) -> float:
        """How long the repair (or replacement) itself takes."""
        return self.replace_s if repair == "replace" else self.repair_s.get(repair, self.repair_s.get("inspect", 1800.0))

    def out_s(self, repair: str) -> float:
        """How long a node drained for `repair` is out when everything passes: drain, repair, validation, undrain."""
        return self.drain_s + self.fix_s(repair) + self.validate_s + self.undrain_s


def bot_config(values: Mapping) -> SimulatedBotConfig:
    """A scenario's bot block, checked now with the field named."""
    try:
        return SimulatedBotConfig.model_validate(values)
    except ValidationError as exc:
        where = "; ".join(f"bot.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"scenario {where}") from None


def _repair_kind(event: Mapping) -> str:
    """The repair the lifecycle asked for: evidence.repair (docs/remediation.md)."""
    kind = (event.get("evidence") or {}).get("repair")
    return kind if kind in REPAIR_KINDS else "inspect"


class SimulatedBot:
    """Collects drain events as they arrive and releases each answer once simulated time passes its due time.

    `checkpoint_after(host, ts)`: when the job on `host` next saves a checkpoint (None: it runs none). A drain asked
    for after the job (mode after_jobs: a suspect's) waits for it, as a scheduler's drain lets the job reach its
    checkpoint before the node leaves; without it, such a drain is answered like any other."""

    def __init__(self, config: SimulatedBotConfig | None = None,
                 checkpoint_after: Callable[[str, float], float | None] | None = None):
        self.config = config or SimulatedBotConfig()
        self.checkpoint_after = checkpoint_after
        self._due: list[tuple[float, int, RemediationResult]] = []
        self._order = itertools.count()
        self._superseded: set[str] = set()
        self.shared: dict[tuple, float] = {}  # an NVLink domain incident's one repair: when it is done
        self.answered: dict[str, int] = {}

    def delay(self, event: Mapping) -> float:
        c, action = self.config, event["action"]
        if action in ("repair", "replace"):
            return c.fix_s("replace" if action == "replace" else _repair_kind(event))
        return {"drain": c.drain_s, "validate": c.validate_s}.get(action, c.undrain_s)

    def _shared_done(self, event: Mapping) -> float | None:
        """For a repair of a tray an NVLink domain's incident drained: when the incident's one repair (begun at the
        first tray's request, per attempt) is done, as bots/commands.py runs it; None for any other request."""
        evidence = event.get("evidence") or {}
        if event["action"] != "repair" or not evidence.get("incident") or "domain" not in self.config.repair_s:
            return None
        key = (evidence["incident"], evidence.get("incident_since", ""), evidence.get("attempt", ""))
        return self.shared.setdefault(key, float(event["ts"]) + self.config.repair_s["domain"])

    def _waits(self, event: Mapping) -> float:
        """Seconds a drain after the job waits for the job's next checkpoint before the drain itself begins."""
        evidence = event.get("evidence") or {}
        if event["action"] != "drain" or evidence.get("mode") != "after_jobs" or self.checkpoint_after is None:
            return 0.0
        at = self.checkpoint_after(event["host"], float(event["ts"]))
        return 0.0 if at is None else max(0.0, at - float(event["ts"]))

    def receive(self, event: Mapping, release_at: float | None = None) -> None:
        """Queue the answer to one DrainEvent (as decoded from fleet.drain.events). It is released by `due` once its
        simulated time has come, or once `release_at` has, on whatever clock the caller gives `due` (`up` releases
        answers on the wall clock); the answer's own time is the request's plus the action's delay either way."""
        resend_of = (event.get("evidence") or {}).get("resend_of")
        if resend_of:  # asked again, now (the GPU failed while its job ran on): one drain, answered once
            self._superseded.add(resend_of)
        shared = self._shared_done(event)
        due = max(float(event["ts"]), shared) if shared is not None else \
            float(event["ts"]) + self._waits(event) + self.delay(event)
        measurements: dict[str, float] = {}
        detail = f"simulated {event['action']} done" if shared is None else \
            f"simulated repair of NVLink domain {event['evidence']['incident']} done (once for its incident's trays)"
        if event["action"] == "validate":
            req = event.get("requirements") or {}
            measurements = {"dcgm_diag_level": float(req.get("dcgm_diag_level", 3.0)),
                            "nccl_busbw_gbs": max(self.config.busbw_gbs, float(req.get("nccl_busbw_min_gbs", 0.0)))}
            detail = f"dcgm diag r{int(measurements['dcgm_diag_level'])} pass, all-reduce busbw " \
                     f"{measurements['nccl_busbw_gbs']:g} GB/s"
        result = RemediationResult(event_id=event["event_id"], host=event["host"], action=event["action"], ok=True,
                                   ts=due, detail=detail, measurements=measurements)
        heapq.heappush(self._due, (due if release_at is None else release_at, next(self._order), result))

    def due(self, now: float) -> list[RemediationResult]:
        """Answers whose release time has come, oldest first."""
        out = []
        while self._due and self._due[0][0] <= now:
            result = heapq.heappop(self._due)[2]
            if result.event_id in self._superseded:
                continue
            self.answered[result.action] = self.answered.get(result.action, 0) + 1
            out.append(result)
        return out

    @property
    def waiting(self) -> int:
        return len(self._due)
