"""What the Kubernetes bot decides about a node and its pods, from the API objects as plain dicts (the JSON the API
server sends). Pure: no API call here, so every decision is tested directly.

Ownership lives on the node, where it survives the bot: the taint `fleetpulse.io/unhealthy=<repair>` is the mark of
a fleetpulse drain, the annotation `fleetpulse.io/event-id` names the request, and `fleetpulse.io/cordoned: "true"`
says the cordon is fleetpulse's too (a node an administrator had cordoned before stays cordoned after fleetpulse).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TAINT_KEY = "fleetpulse.io/unhealthy"
STATE_LABEL = "fleetpulse.io/state"
EVENT_ANNOTATION = "fleetpulse.io/event-id"
CORDON_ANNOTATION = "fleetpulse.io/cordoned"
INCIDENT_ANNOTATION = "fleetpulse.io/nvlink-domain"  # the NVLink domain whose incident drained the node
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # the node controller's mark of a cordon
# An RFC 1123 subdomain: what a Node's name may be (and nothing an API path could read otherwise).
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def taints(node: Mapping) -> list[dict]:
    return list((node.get("spec") or {}).get("taints") or [])


def annotations(node: Mapping) -> dict:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def cordoned(node: Mapping) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def ours(node: Mapping) -> bool:
    """fleetpulse drained it: its taint is on the node."""
    return any(t.get("key") == TAINT_KEY for t in taints(node))


def event_of(node: Mapping) -> str:
    return annotations(node).get(EVENT_ANNOTATION, "") if ours(node) else ""


def foreign(node: Mapping) -> str:
    """Why someone else holds the node out of service ('' when nobody, or fleetpulse, does): a cordon that is not
    fleetpulse's, with the taints others put on it."""
    if not cordoned(node) or ours(node):
        return ""
    others = [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in taints(node)
              if t.get("key") != UNSCHEDULABLE_TAINT]
    return "cordoned by someone else" + (f" (taints {', '.join(others)})" if others else "")


def label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    return _LABEL_VALUE.sub("_", text)[:63].strip("_.-") or "unknown"


def drain_patch(node: Mapping, event: Mapping, noexecute_on_immediate: bool) -> dict:
    """The strategic-merge patch that drains `node` for `event`: cordon (remembered as fleetpulse's only when the node
    was schedulable), fleetpulse's taint (NoExecute when the event asks for immediate evacuation and that is allowed,
    else NoSchedule) beside every taint already there, the state label and the event id. The node's resourceVersion
    makes the patch fail rather than overwrite a change made since it was read (taints are one list)."""
    evidence = event.get("evidence") or {}
    effect = "NoExecute" if noexecute_on_immediate and evidence.get("mode") == "immediate" else "NoSchedule"
    mine = {"key": TAINT_KEY, "value": label_value(evidence.get("repair") or "inspect"), "effect": effect}
    kept = [t for t in taints(node) if t.get("key") != TAINT_KEY]
    meta = node.get("metadata") or {}
    notes = {EVENT_ANNOTATION: event["event_id"]}
    if evidence.get("incident"):  # one of an NVLink domain's trays drained as one incident: found together
        notes[INCIDENT_ANNOTATION] = str(evidence["incident"])
    if not cordoned(node):
        notes[CORDON_ANNOTATION] = "true"
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": {STATE_LABEL: "draining"},
                         "annotations": notes},
            "spec": {"unschedulable": True, "taints": [*kept, mine]}}


def undrain_patch(node: Mapping) -> dict:
    """Return the node: fleetpulse's taint off (every other taint kept), uncordoned only when the cordon was
    fleetpulse's, its label and annotations removed."""
    patch: dict = {"metadata": {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion"),
                                "labels": {STATE_LABEL: None},
                                "annotations": {EVENT_ANNOTATION: None, CORDON_ANNOTATION: None,
                                                INCIDENT_ANNOTATION: None}},
                   "spec": {"taints": [t for t in taints(node) if t.get("key") != TAINT_KEY]}}
    if annotations(node).get(CORDON_ANNOTATION) == "true":
        patch["spec"]["unschedulable"] = False  # and the taint the node controller keeps for a cordon goes with it
        patch["spec"]["taints"] = [t for t in patch["spec"]["taints"] if t.get("key") != UNSCHEDULABLE_TAINT]
    return patch


def state_patch(node: Mapping, state: str) -> dict:
    return {"metadata": {"labels": {STATE_LABEL: label_value(state)}}}


@dataclass(frozen=True)
class PodPlan:
    evict: list[tuple[str, str]]  # (namespace, name) still to leave the node
    skipped: list[str]  # why each pod stays: DaemonSet, mirror pod
    terminating: list[str]  # eviction accepted, still shutting down


def pods_to_evict(pods: list[Mapping]) -> PodPlan:
    """Which pods must leave before the node is drained: everything running on it except DaemonSet pods (they belong
    to the node and would come straight back) and mirror (static) pods (the kubelet owns them); finished pods are
    ignored, and pods already terminating are waited for, not evicted again."""
    evict, skipped, terminating = [], [], []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        who = f"{meta.get('namespace')}/{meta.get('name')}"
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            skipped.append(f"{who} (mirror pod)")
        elif any(o.get("kind") == "DaemonSet" and o.get("controller") for o in meta.get("ownerReferences") or []):
            skipped.append(f"{who} (DaemonSet)")
        elif meta.get("deletionTimestamp"):
            terminating.append(who)
        else:
            evict.append((meta.get("namespace"), meta.get("name")))
    return PodPlan(evict, skipped, terminating)
