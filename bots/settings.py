"""Settings of a remediation bot process."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from bots.slurm.config import SlurmBotConfig
from core.settings import CommonSettings


class BotSettings(CommonSettings):
    """FLEETPULSE_BOT_* and the Slurm bot's FLEETPULSE_BOT_SLURM (JSON); the rest is shared with every process."""

    bot_group_id: str = Field(default="fleetpulse-bot-slurm", min_length=1,
                              description="consumer group: one per cluster the bot serves")
    bot_ledger: Path | None = Field(default=None, description="the bot's durable record of events and actions; "
                                                              "default <data_dir>/bot/<kind>-ledger.jsonl")
    bot_slurm: SlurmBotConfig = Field(default_factory=SlurmBotConfig)

    def ledger_path(self, kind: str) -> Path:
        return self.bot_ledger or self.data_dir / "bot" / f"{kind}-ledger.jsonl"
