"""What the Kubernetes bot runs, as FLEETPULSE_BOT_KUBERNETES (JSON): the fields every bot has (bots/config.py) and
the API server's."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from bots.config import BotConfig


class KubernetesBotConfig(BotConfig):
    kubeconfig: Path | None = Field(default=None, description="a kubeconfig file; unset: the in-cluster service "
                                    "account (deploy/kubernetes/bot.yaml), else ~/.kube/config")
    context: str | None = Field(default=None, description="the kubeconfig context to use")
    noexecute_on_immediate: bool = Field(default=False, description="mode=immediate (the node is broken now): the "
                                         "taint is NoExecute, whose taint manager removes every pod that does not "
                                         "tolerate it at once, disruption budgets or not, DaemonSets included (the "
                                         "agent's and DCGM's must tolerate fleetpulse.io/unhealthy); false: "
                                         "NoSchedule and evictions only")
    eviction_timeout_s: float = Field(default=1800.0, gt=0, description="a drain whose pods are still there after "
                                      "this (a disruption budget refusing) is answered failed")
    delete_after_timeout: bool = Field(default=False, description="past eviction_timeout_s, delete the pods the "
                                       "budgets kept (and those stuck terminating) without grace instead of answering "
                                       "failed")
    delete_wait_s: float = Field(default=120.0, gt=0, description="after such deletions, how long the pods may "
                                 "still be listed before the drain is answered failed")
