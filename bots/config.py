"""What every remediation bot is configured with, whatever its scheduler: which requests it takes, how it polls, and
the commands it runs for repairs and validation. Commands are argument lists, never shell lines: the placeholders
{node}, {host}, {event_id}, {level}, {gpu} are filled in per argument, so a host name from Kafka cannot inject one."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

# "domain": the shared part of an NVLink domain (its Fabric Manager, its NVSwitch trays), run once for all the trays
# an incident drained (streams/lifecycle/domains.py)
REPAIR_KINDS = ("reset", "reboot", "inspect", "replace", "domain")
PLACEHOLDERS = ("node", "host", "event_id", "level", "gpu", "domain")


class BotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_names: dict[str, str] = Field(default_factory=dict, description="fleet host -> the scheduler's node name "
                                                                         "where they differ; others are the same name")
    poll_s: float = Field(default=5.0, gt=0, le=300, description="how often a waiting action looks at the node")
    max_age_s: dict[str, float] = Field(
        default_factory=lambda: {"drain": 3600.0, "repair": 4 * 3600.0, "validate": 4 * 3600.0, "undrain": 3600.0,
                                 "replace": 14 * 86_400.0},
        description="a request older than this when read is skipped, not acted on: the lifecycle has re-sent it by "
                    "then (its request timeouts), and a new consumer group must not replay a month of drains")
    max_concurrent: int = Field(default=16, ge=1, description="actions running at once (each polls the scheduler)")
    repair_commands: dict[str, list[str]] = Field(
        default_factory=dict, description="repair kind (reset, reboot, inspect, replace, domain) -> command; a kind "
        "without one is answered failed unless the scheduler has its own way (Slurm: scontrol reboot); domain: the "
        "shared part of an NVLink domain ({domain}), run once for every tray its incident drained (without it, each "
        "tray gets its own repair)")
    dcgm_diag_command: list[str] | None = Field(
        default_factory=lambda: ["ssh", "{node}", "dcgmi", "diag", "-r", "{level}"],
        description="runs DCGM diagnostics at {level} on the node; exit 0 = passed; null = not run")
    nccl_command: list[str] | None = Field(
        default=None, description="an nccl-tests run on the node (e.g. all_reduce_perf); its 'Avg bus bandwidth' "
        "is reported as nccl_busbw_gbs; null = not run")
    command_timeout_s: float = Field(default=3600.0, gt=0, description="a repair or check command running longer "
                                     "is killed and failed")

    @field_validator("repair_commands")
    @classmethod
    def _known_kinds(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = set(value) - set(REPAIR_KINDS)
        if unknown:
            raise ValueError(f"unknown repair kinds {sorted(unknown)}; known: {list(REPAIR_KINDS)}")
        for kind, argv in value.items():
            _check_argv(argv, f"repair_commands.{kind}")
        return value

    @field_validator("dcgm_diag_command", "nccl_command")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            _check_argv(value, "command")
        return value

    def node_of(self, host: str) -> str:
        return self.node_names.get(host, host)


def _check_argv(argv: list[str], where: str) -> None:
    if not argv or not argv[0]:
        raise ValueError(f"{where}: an empty command")
    for arg in argv:
        try:
            arg.format(**{p: "" for p in PLACEHOLDERS})
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{where}: {arg!r} has an unknown placeholder ({exc}); known: {list(PLACEHOLDERS)}")
