"""The Kubernetes bot's actions through the official client: drain (cordon, fleetpulse's taint, evictions through
the Eviction API so PodDisruptionBudgets hold), repair and validation by configured commands (bots/commands.py),
undrain (only fleetpulse's own taint and cordon come off). Decisions are bots/kubernetes/nodes.py's; this module
only asks the API server and waits. The client is synchronous: each call runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bots.commands import Commands
from bots.kubernetes import nodes
from bots.kubernetes.config import KubernetesBotConfig
from bots.runner import Outcome, Steps

log = logging.getLogger(__name__)
# What this module asks of the API server (resource, verb): deploy/kubernetes/bot.yaml's ClusterRole grants exactly
# these (pods delete only serves delete_after_timeout), checked by tests/bots/test_kubernetes_bot.py.
CALLS = {("nodes", "get"), ("nodes", "patch"), ("pods", "list"), ("pods/eviction", "create"), ("pods", "delete"),
         ("namespaces", "get")}


class KubeError(RuntimeError):
    """The API server refused or did not answer; the text is its own, the HTTP status where there was one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _refusal(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        causes = "; ".join(c.get("message", "") for c in (body.get("details") or {}).get("causes") or [])
        return f"{exc.status} {body.get('reason') or exc.reason}: {body.get('message', '')}" + \
            (f" ({causes})" if causes else "")
    except (ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"


class KubernetesExecutor:
    def __init__(self, config: KubernetesBotConfig, api: k8s.CoreV1Api, clock: Callable[[], float] = time.time):
        self.config, self.api, self.clock = config, api, clock
        self.commands = Commands(config, clock)
        self._known: dict[str, tuple[bool, float]] = {}

    # -- the API server ---------------------------------------------------------------------------------------

    async def _call(self, method: str, *args, **kwargs):
        """One client call in a thread; the raw JSON as a dict (what the API server sent, not the client's models)."""
        def call():
            response = getattr(self.api, method)(*args, _preload_content=False, _request_timeout=60, **kwargs)
            data = response.data
            return json.loads(data) if data else {}
        return await asyncio.to_thread(call)

    async def node(self, name: str) -> dict | None:
        if not nodes.NODE_NAME.fullmatch(name):
            return None
        try:
            return await self._call("read_node", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(f"read node {name}: {_refusal(exc)}") from None

    async def _patch(self, name: str, body: dict) -> dict:
        try:
            return await self._call("patch_node", name, body)
        except ApiException as exc:
            raise KubeError(f"patch node {name}: {_refusal(exc)}", status=exc.status) from None

    async def cluster_id(self) -> str:
        """The cluster's identity for the bot's consumer group: kube-system's uid, the usual cluster id (each cluster's
        bot must read every request in a group of its own)."""
        try:
            found = await self._call("read_namespace", "kube-system")
        except ApiException as exc:
            raise KubeError(f"read namespace kube-system: {_refusal(exc)}") from None
        return str((found.get("metadata") or {}).get("uid", ""))[:8] or "unknown"

    async def _pods(self, name: str) -> list[dict]:
        try:
            listed = await self._call("list_pod_for_all_namespaces", field_selector=f"spec.nodeName={name}")
        except ApiException as exc:
            raise KubeError(f"list pods on {name}: {_refusal(exc)}") from None
        return listed.get("items") or []

    async def _evict(self, namespace: str, pod: str) -> str | None:
        """Ask the Eviction API; None when accepted (or the pod is gone), else why not (a disruption budget)."""
        body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=pod, namespace=namespace))
        try:
            await self._call("create_namespaced_pod_eviction", pod, namespace, body)
            return None
        except ApiException as exc:
            if exc.status == 404:
                return None
            return _refusal(exc)

    async def serves(self, host: str) -> bool:
        """A host the cluster has a Node for (as named, or node_names' mapping); answers are kept a minute."""
        known, at = self._known.get(host, (False, -1e18))
        if self.clock() - at > 60:
            known = await self.node(self.config.node_of(host)) is not None
            self._known[host] = (known, self.clock())
        return known

    # -- actions ----------------------------------------------------------------------------------------------

    async def act(self, event: dict, steps: Steps) -> Outcome:
        name = self.config.node_of(event["host"])
        node = await self.node(name)
        if node is None:
            return Outcome(False, f"the cluster has no node {name}")
        action = event["action"]
        if action == "drain":
            return await self._drain(event, name, node, steps)
        if action == "undrain":
            return await self._undrain(name, node)
        if not nodes.ours(node):
            why = nodes.foreign(node) or "it is in service"
            return Outcome(False, f"{action} not done: node {name} is not drained by fleetpulse ({why})")
        if action == "validate":
            outcome = await self.commands.validate(event, name, steps)
        else:
            outcome = await self.commands.repair(self.commands.repair_kind(event), event, name, steps)
        await self._label(name, f"{action}-{'ok' if outcome.ok else 'failed'}")
        return outcome

    async def _drain(self, event: dict, name: str, node: dict, steps: Steps) -> Outcome:
        if not steps.done("marked"):
            for attempt in range(3):  # the node changed since it was read (409): read it again, decide again
                if why := nodes.foreign(node):
                    return Outcome(True, f"already out of service, not claimed by fleetpulse: {name} {why}")
                if nodes.event_of(node) == event["event_id"]:  # patched just before a restart, not recorded
                    break
                try:
                    await self._patch(name, nodes.drain_patch(node, event, self.config.noexecute_on_immediate))
                    break
                except KubeError as exc:
                    if exc.status != 409 or attempt == 2 or (node := await self.node(name)) is None:
                        raise
            steps.record("marked", at=self.clock())
        deadline = steps.done("marked")["at"] + self.config.eviction_timeout_s
        blocked: dict[str, str] = {}
        while True:
            try:
                plan = nodes.pods_to_evict(await self._pods(name))
                if not plan.evict and not plan.terminating:
                    await self._label(name, "drained")
                    kept = f"; left in place: {', '.join(plan.skipped)}" if plan.skipped else ""
                    return Outcome(True, f"{name} cordoned, tainted {nodes.TAINT_KEY} and emptied{kept}")
                if self.clock() >= deadline:
                    return await self._overdue(name, plan, blocked)
                blocked = {}
                for namespace, pod in plan.evict:
                    if (why := await self._evict(namespace, pod)) is not None:
                        blocked[f"{namespace}/{pod}"] = why
            except KubeError as exc:  # the API server did not answer this poll: only the deadline fails a drain
                if self.clock() >= deadline:
                    return Outcome(False, f"drain of {name} not confirmed within {self.config.eviction_timeout_s:g} s: "
                                          f"{exc}")
                log.warning("%s: %s (polling on)", name, exc)
            await asyncio.sleep(self.config.poll_s)

    async def _label(self, name: str, state: str) -> None:
        try:  # the label is for people; an answer must not be lost to it
            await self._patch(name, nodes.state_patch({}, state))
        except KubeError as exc:
            log.warning("%s: state label not set: %s", name, exc)

    async def _overdue(self, name: str, plan: nodes.PodPlan, blocked: dict[str, str]) -> Outcome:
        waiting = [f"{ns}/{pod}" for ns, pod in plan.evict] + plan.terminating
        why = "; ".join(f"{pod}: {blocked[pod]}" for pod in waiting if pod in blocked)
        if not self.config.delete_after_timeout:
            return Outcome(False, f"pods still on {name} after {self.config.eviction_timeout_s:g} s: "
                                  f"{', '.join(waiting)}" + (f" ({why})" if why else "") + "; not force-deleted")
        for who in waiting:  # refused evictions and pods stuck terminating alike: deleted without grace
            namespace, pod = who.split("/", 1)
            try:
                await self._call("delete_namespaced_pod", pod, namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    return Outcome(False, f"deleting {who} after the eviction timeout: {_refusal(exc)}")
        deadline = self.clock() + self.config.delete_wait_s
        while (left := self._left(await self._pods(name))) and self.clock() < deadline:
            await asyncio.sleep(self.config.poll_s)
        if left:
            return Outcome(False, f"{name}: {', '.join(left)} still listed {self.config.delete_wait_s:g} s after "
                                  "deletion (is its kubelet down?)")
        await self._label(name, "drained")
        return Outcome(True, f"{name}: pods deleted after {self.config.eviction_timeout_s:g} s of evictions refused "
                             f"({why or 'still terminating'}): {', '.join(waiting)}")

    @staticmethod
    def _left(pods: list[dict]) -> list[str]:
        plan = nodes.pods_to_evict(pods)
        return [f"{ns}/{pod}" for ns, pod in plan.evict] + plan.terminating

    async def _undrain(self, name: str, node: dict) -> Outcome:
        if not nodes.ours(node):
            if why := nodes.foreign(node):
                return Outcome(False, f"left out of service: {name} {why}")
            return Outcome(True, f"{name} already schedulable")
        await self._patch(name, nodes.undrain_patch(node))
        if nodes.cordoned(node) and nodes.annotations(node).get(nodes.CORDON_ANNOTATION) != "true":
            return Outcome(False, f"{name}: taint {nodes.TAINT_KEY} removed; left cordoned: the cordon was there "
                                  "before fleetpulse's drain, not fleetpulse's to lift")
        after = await self.node(name)
        if after is None or nodes.cordoned(after) or nodes.ours(after):
            return Outcome(False, f"{name}: patched, but the API server still shows it "
                                  f"{'gone' if after is None else 'cordoned or tainted'}")
        return Outcome(True, f"{name}: taint {nodes.TAINT_KEY} removed, uncordoned, schedulable")
