"""What the Slurm bot runs, as FLEETPULSE_BOT_SLURM (JSON): the fields every bot has (bots/config.py) and Slurm's."""

from __future__ import annotations

from pydantic import Field

from bots.config import BotConfig


class SlurmBotConfig(BotConfig):
    scontrol: str = Field(default="scontrol", description="path of scontrol (squeue is looked up beside it)")
    drain_timeout_s: float = Field(default=3300.0, gt=0, description="a drain whose jobs still run after this is "
                                   "answered failed (the lifecycle re-sends after 1 h)")
    requeue_immediate: bool = Field(default=True, description="mode=immediate: requeue the node's running jobs "
                                    "rather than wait for them")
    reboot_timeout_s: float = Field(default=1800.0, gt=0, description="a reboot not complete after this failed")
    resume_timeout_s: float = Field(default=120.0, gt=0, description="an undrain whose node is not schedulable "
                                    "(in service and responding) after this failed")
