"""Settings of a remediation bot process."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from bots.kubernetes.config import KubernetesBotConfig
from bots.slurm.config import SlurmBotConfig
from core.settings import CommonSettings


class BotSettings(CommonSettings):
    """FLEETPULSE_BOT_*, with each bot's own as JSON (FLEETPULSE_BOT_SLURM, FLEETPULSE_BOT_KUBERNETES); the rest is
    shared with every process."""

    bot_group_id: str | None = Field(default=None, min_length=1, description="consumer group: one per cluster the "
                                     "bot serves (each reads every request and acts on its own nodes); default "
                                     "fleetpulse-bot-<kind>-<the scheduler's cluster name or id>")
    bot_ledger: Path | None = Field(default=None, description="the bot's durable record of events and actions; "
                                                              "default <data_dir>/bot/<kind>-ledger.jsonl")
    bot_metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Prometheus /metrics of the bot "
                                         "(e.g. 9466); empty or off: none")
    bot_metrics_addr: str = Field(default="0.0.0.0", description="address the bot's /metrics listens on")
    bot_slurm: SlurmBotConfig = Field(default_factory=SlurmBotConfig, description="the Slurm bot, as JSON")
    bot_kubernetes: KubernetesBotConfig = Field(default_factory=KubernetesBotConfig,
                                                description="the Kubernetes bot, as JSON")

    @field_validator("bot_metrics_port", mode="before")
    @classmethod
    def _off(cls, value):
        return None if value in ("", "off", "none") else value

    @staticmethod
    def group_id(kind: str, cluster: str) -> str:
        """The default group of a `kind` bot serving `cluster` (its scheduler's name or id for it)."""
        return f"fleetpulse-bot-{kind}-{cluster}"

    def ledger_path(self, kind: str) -> Path:
        return self.bot_ledger or self.data_dir / "bot" / f"{kind}-ledger.jsonl"
