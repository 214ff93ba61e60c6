"""`fleetpulse bot kubernetes`: its decisions on recorded API objects, and its requests through the official client to
recorded API server responses served over HTTP (no API server runs here: tests/bots/kubernetes_api/README.md)."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest
from kubernetes import client as k8s

from bots.kubernetes import nodes
from bots.kubernetes.config import KubernetesBotConfig
from bots.kubernetes.executor import CALLS, KubernetesExecutor
from bots.ledger import Ledger
from bots.runner import Steps
from tests.bots.kube_api import RecordedApi, recorded

NODE = "/api/v1/nodes/gpu-0042"
PODS = "/api/v1/pods"
EVICT = "/api/v1/namespaces/training/pods/llm-pretrain-worker-17/eviction"
WORKER = "/api/v1/namespaces/training/pods/llm-pretrain-worker-17"


def event(action: str, **evidence) -> dict:
    return {"event_id": f"gpu-0042:3:{action}:1", "host": "gpu-0042", "action": action, "ts": time.time(),
            "reason": "test", "evidence": evidence, "requirements": {}}


def drained(node: dict, event_id: str = "gpu-0042:3:drain:1", cordon_ours: bool = True) -> dict:
    """The node as the API server returns it after fleetpulse's drain patch (and the node controller's cordon taint)."""
    node = copy.deepcopy(node)
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] += [{"key": nodes.TAINT_KEY, "value": "reset", "effect": "NoSchedule"},
                               {"key": nodes.UNSCHEDULABLE_TAINT, "effect": "NoSchedule",
                                "timeAdded": "2026-12-03T06:41:00Z"}]
    node["metadata"]["labels"][nodes.STATE_LABEL] = "drained"
    node["metadata"]["annotations"][nodes.EVENT_ANNOTATION] = event_id
    if cordon_ours:
        node["metadata"]["annotations"][nodes.CORDON_ANNOTATION] = "true"
    return node


def cordoned_by_admin(node: dict) -> dict:
    node = copy.deepcopy(node)
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"].append({"key": nodes.UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    return node


# -- decisions ------------------------------------------------------------------------------------------------


def test_the_drain_patch_cordons_taints_beside_other_taints_and_is_conditional():
    node = recorded("node-gpu-0042.json")
    patch = nodes.drain_patch(node, event("drain", repair="reset", mode="after_jobs"), noexecute_on_immediate=True)
    assert patch["spec"] == {"unschedulable": True, "taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": nodes.TAINT_KEY, "value": "reset", "effect": "NoSchedule"}]}
    assert patch["metadata"] == {"resourceVersion": "918273", "labels": {nodes.STATE_LABEL: "draining"},
                                 "annotations": {nodes.EVENT_ANNOTATION: "gpu-0042:3:drain:1",
                                                 nodes.CORDON_ANNOTATION: "true"}}
    immediate = event("drain", repair="reboot", mode="immediate")
    assert nodes.drain_patch(node, immediate, True)["spec"]["taints"][-1]["effect"] == "NoExecute"
    assert nodes.drain_patch(node, immediate, False)["spec"]["taints"][-1]["effect"] == "NoSchedule"
    # a node already cordoned (by fleetpulse's own earlier drain): the cordon is not claimed a second time
    assert nodes.CORDON_ANNOTATION not in nodes.drain_patch(drained(node), immediate, True)["metadata"]["annotations"]
    tray = event("drain", repair="reboot", mode="immediate", incident="6f3c0a1e/7")  # an NVLink domain's incident
    assert nodes.drain_patch(node, tray, True)["metadata"]["annotations"][nodes.INCIDENT_ANNOTATION] == "6f3c0a1e/7"
    assert nodes.INCIDENT_ANNOTATION not in patch["metadata"]["annotations"]


def test_undrain_removes_only_fleetpulse_s_taint_and_its_own_cordon():
    node = drained(recorded("node-gpu-0042.json"))
    patch = nodes.undrain_patch(node)
    assert patch["spec"] == {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                             "unschedulable": False}
    assert patch["metadata"]["annotations"] == {nodes.EVENT_ANNOTATION: None, nodes.CORDON_ANNOTATION: None,
                                                nodes.INCIDENT_ANNOTATION: None}
    theirs = drained(recorded("node-gpu-0042.json"), cordon_ours=False)
    kept = nodes.undrain_patch(theirs)["spec"]
    assert "unschedulable" not in kept and {t["key"] for t in kept["taints"]} == {"nvidia.com/gpu",
                                                                                  nodes.UNSCHEDULABLE_TAINT}


def test_whose_node_it_is():
    node = recorded("node-gpu-0042.json")
    assert nodes.foreign(node) == "" and not nodes.ours(node)
    assert nodes.foreign(cordoned_by_admin(node)) == \
        "cordoned by someone else (taints nvidia.com/gpu=present:NoSchedule)"
    assert nodes.ours(drained(node)) and nodes.foreign(drained(node)) == ""
    assert nodes.event_of(drained(node, "e-7")) == "e-7"


def test_daemonset_mirror_and_finished_pods_stay_the_rest_are_evicted():
    plan = nodes.pods_to_evict(recorded("pods-on-gpu-0042.json")["items"])
    assert plan.evict == [("training", "llm-pretrain-worker-17")]
    assert plan.skipped == ["gpu-operator/nvidia-device-plugin-daemonset-x7k2p (DaemonSet)",
                            "kube-system/kube-proxy-gpu-0042 (mirror pod)"]
    terminating = recorded("pods-on-gpu-0042.json")["items"][:1]
    terminating[0]["metadata"]["deletionTimestamp"] = "2026-12-03T06:42:00Z"
    assert nodes.pods_to_evict(terminating).terminating == ["training/llm-pretrain-worker-17"]


@pytest.mark.parametrize("name, one", [("gpu-0042", True), ("gpu-0042.us-east-1.compute.internal", True),
                                       ("GPU-0042", False), ("gpu-0042/../x", False), ("-x", False), ("", False)])
def test_a_host_names_one_node(name, one):
    assert bool(nodes.NODE_NAME.fullmatch(name)) is one


# -- requests through the official client ---------------------------------------------------------------------


@pytest.fixture
def api():
    with RecordedApi() as server:
        yield server


class Clock:
    """Ten seconds pass at every look: the bot's deadlines come without the test waiting for them."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 10.0
        return self.t


def executor(api: RecordedApi, clock=time.time, **config) -> KubernetesExecutor:
    conf = k8s.Configuration()
    conf.host = api.url
    return KubernetesExecutor(KubernetesBotConfig(poll_s=0.01, **config), k8s.CoreV1Api(k8s.ApiClient(conf)),
                              clock=clock)


def act(ex: KubernetesExecutor, e: dict, tmp_path, ledger: Ledger | None = None):
    ledger = ledger or Ledger(tmp_path / "ledger.jsonl")
    entry = ledger.get(e["event_id"]) or ledger.accept(e)
    return asyncio.run(ex.act(e, Steps(ledger, entry)))


def pods_after_eviction() -> dict:
    pods = recorded("pods-on-gpu-0042.json")
    pods["items"] = pods["items"][1:]  # the worker is gone; DaemonSet, mirror and finished pods remain
    return pods


def test_a_drain_cordons_taints_evicts_through_the_eviction_api_and_waits_for_the_pods(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    api.on("GET", NODE, (200, node))
    api.on("PATCH", NODE, (200, drained(node)))
    api.on("GET", PODS, (200, recorded("pods-on-gpu-0042.json")), (200, pods_after_eviction()))
    api.on("POST", EVICT, (201, recorded("eviction-created.json")))
    out = act(executor(api), event("drain", repair="reset", mode="after_jobs"), tmp_path)
    assert out.ok and "emptied" in out.detail and "nvidia-device-plugin-daemonset-x7k2p (DaemonSet)" in out.detail
    patches = api.asked("PATCH")
    assert patches[0]["content_type"] == "application/strategic-merge-patch+json"
    assert patches[0]["body"]["spec"]["unschedulable"] is True
    assert patches[0]["body"]["metadata"]["resourceVersion"] == "918273"
    assert patches[-1]["body"] == {"metadata": {"labels": {nodes.STATE_LABEL: "drained"}}}
    assert api.asked("GET", "/pods")[0]["query"] == {"fieldSelector": ["spec.nodeName=gpu-0042"]}
    evictions = api.asked("POST")
    assert [e["path"] for e in evictions] == [EVICT]  # only the worker: not the DaemonSet, mirror or finished pod
    assert evictions[0]["body"]["metadata"] == {"name": "llm-pretrain-worker-17", "namespace": "training"}
    assert api.asked("DELETE") == [] and api.unexpected == []


def test_a_disruption_budget_that_holds_fails_the_drain_without_deleting_anything(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    api.on("GET", NODE, (200, node))
    api.on("PATCH", NODE, (200, drained(node)))
    api.on("GET", PODS, (200, recorded("pods-on-gpu-0042.json")))
    api.on("POST", EVICT, (429, recorded("eviction-disruption-budget.json")))
    out = act(executor(api, eviction_timeout_s=0.3), event("drain", repair="reset", mode="after_jobs"), tmp_path)
    assert not out.ok and "training/llm-pretrain-worker-17" in out.detail and "not force-deleted" in out.detail
    assert "llm-pretrain-pdb needs 16 healthy pods" in out.detail
    assert len(api.asked("POST")) >= 2  # asked again at each poll, as kubectl drain does
    assert api.asked("DELETE") == [] and api.unexpected == []


def test_past_the_timeout_pods_are_deleted_only_when_configured_and_must_then_be_gone(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    api.on("GET", NODE, (200, node))
    api.on("PATCH", NODE, (200, drained(node)))
    api.on("GET", PODS, (200, recorded("pods-on-gpu-0042.json")), (200, pods_after_eviction()))
    api.on("DELETE", WORKER, (200, recorded("pods-on-gpu-0042.json")["items"][0]))
    ex = executor(api, clock=Clock(), eviction_timeout_s=5, delete_after_timeout=True)
    out = act(ex, event("drain", mode="after_jobs"), tmp_path)
    assert out.ok and "pods deleted after" in out.detail
    deleted = api.asked("DELETE")
    assert [d["path"] for d in deleted] == [WORKER] and deleted[0]["query"] == {"gracePeriodSeconds": ["0"]}
    assert api.unexpected == []


def test_a_pod_still_listed_after_its_deletion_fails_the_drain(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    stuck = recorded("pods-on-gpu-0042.json")
    stuck["items"][0]["metadata"]["deletionTimestamp"] = "2026-12-03T06:42:00Z"  # its kubelet never confirms
    api.on("GET", NODE, (200, node))
    api.on("PATCH", NODE, (200, drained(node)))
    api.on("GET", PODS, (200, stuck))
    api.on("DELETE", WORKER, (200, stuck["items"][0]))
    ex = executor(api, clock=Clock(), eviction_timeout_s=5, delete_after_timeout=True, delete_wait_s=60)
    out = act(ex, event("drain", mode="after_jobs"), tmp_path)
    assert not out.ok and "training/llm-pretrain-worker-17 still listed 60 s after deletion" in out.detail
    assert api.asked("POST") == []  # a terminating pod is waited for, never evicted again


def test_a_node_changed_since_it_was_read_is_read_again_and_one_poll_the_api_refuses_is_not_fatal(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    newer = copy.deepcopy(node)
    newer["metadata"]["resourceVersion"] = "918290"
    conflict = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Conflict",
                "message": "Operation cannot be fulfilled on nodes \"gpu-0042\": the object has been modified; "
                           "please apply your changes to the latest version and try again", "code": 409}
    api.on("GET", NODE, (200, node), (200, newer))
    api.on("PATCH", NODE, (409, conflict), (200, drained(newer)))
    api.on("GET", PODS, (503, {"kind": "Status", "status": "Failure", "code": 503}), (200, pods_after_eviction()))
    out = act(executor(api), event("drain", repair="reset", mode="after_jobs"), tmp_path)
    assert out.ok, out
    versions = [p["body"]["metadata"].get("resourceVersion") for p in api.asked("PATCH")]
    assert versions == ["918273", "918290", None]  # the drain patch twice (the second on the newer node), the label


def test_a_node_someone_else_cordoned_is_never_claimed_touched_or_returned(api, tmp_path):
    api.on("GET", NODE, (200, cordoned_by_admin(recorded("node-gpu-0042.json"))))
    ex = executor(api)
    drain = act(ex, event("drain", repair="reboot", mode="immediate"), tmp_path)
    assert drain.ok and "not claimed" in drain.detail
    ledger = Ledger(tmp_path / "other.jsonl")
    repair = act(ex, event("repair", repair="reboot"), tmp_path, ledger)
    undrain = act(ex, event("undrain"), tmp_path, ledger)
    assert not repair.ok and "cordoned by someone else" in repair.detail
    assert not undrain.ok and "left out of service" in undrain.detail
    assert api.asked("PATCH") == [] and api.asked("POST") == [] and api.unexpected == []


def test_undrain_lifts_fleetpulse_s_cordon_but_not_one_that_was_there_before(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    api.on("GET", NODE, (200, drained(node)), (200, node))
    api.on("PATCH", NODE, (200, node))
    out = act(executor(api), event("undrain"), tmp_path)
    assert out.ok and "uncordoned, schedulable" in out.detail
    assert api.asked("PATCH")[0]["body"]["spec"] == {
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], "unschedulable": False}
    api.requests.clear()
    api.on("GET", NODE, (200, drained(node, cordon_ours=False)))
    out = act(executor(api), event("undrain"), tmp_path, Ledger(tmp_path / "second.jsonl"))
    assert not out.ok and "left cordoned" in out.detail
    assert "unschedulable" not in api.asked("PATCH")[0]["body"]["spec"]


def test_a_drain_patched_just_before_a_restart_is_not_patched_again(api, tmp_path):
    node = recorded("node-gpu-0042.json")
    api.on("GET", NODE, (200, drained(node)))  # carries this very event's id: the patch happened, its record not
    api.on("PATCH", NODE, (200, drained(node)))
    api.on("GET", PODS, (200, pods_after_eviction()))
    out = act(executor(api), event("drain", repair="reset", mode="after_jobs"), tmp_path)
    assert out.ok
    assert [p["body"] for p in api.asked("PATCH")] == [{"metadata": {"labels": {nodes.STATE_LABEL: "drained"}}}]


def test_repair_and_validation_run_their_commands_on_a_node_fleetpulse_drained(api, tmp_path):
    node = drained(recorded("node-gpu-0042.json"))
    api.on("GET", NODE, (200, node))
    api.on("PATCH", NODE, (200, node))
    ex = executor(api, repair_commands={"reset": ["sh", "-c", "echo reset {node} gpu {gpu}"]},
                  dcgm_diag_command=["sh", "-c", "echo diag r{level}"])
    repair = act(ex, {**event("repair", repair="reset", gpu_index="3")}, tmp_path)
    assert repair.ok and "reset gpu-0042 gpu 3" in repair.detail
    validate = act(ex, {**event("validate"), "requirements": {"dcgm_diag_level": 3}}, tmp_path)
    assert validate.ok and validate.measurements == {"dcgm_diag_level": 3.0}
    assert [p["body"]["metadata"]["labels"][nodes.STATE_LABEL] for p in api.asked("PATCH")] == \
        ["repair-ok", "validate-ok"]


def test_a_node_the_cluster_does_not_have_is_not_this_bot_s(api):
    api.on("GET", "/api/v1/nodes/gpu-9999", (404, recorded("node-not-found.json")))
    ex = executor(api)
    assert asyncio.run(ex.serves("gpu-9999")) is False
    assert asyncio.run(ex.serves("gpu[1-2]")) is False  # not a node name: not even asked
    assert [r["path"] for r in api.requests] == ["/api/v1/nodes/gpu-9999"]


def test_the_shipped_manifest_grants_what_the_bot_calls_and_keeps_its_ledger(monkeypatch):
    import yaml

    from bots.settings import BotSettings
    from core.settings import load
    from tests.conftest import REPO

    docs = {d["kind"]: d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/bot.yaml").read_text())}
    rules = {(r["resources"][0], v) for r in docs["ClusterRole"]["rules"] for v in r["verbs"]}
    assert rules == CALLS
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    bot = pod["containers"][0]
    assert bot["command"] == ["fleetpulse", "bot", "kubernetes"]
    assert {"key": "fleetpulse.io/unhealthy", "operator": "Exists"} in pod["tolerations"]
    data_dir = next(e["value"] for e in bot["env"] if e["name"] == "FLEETPULSE_DATA_DIR")
    assert bot["volumeMounts"] == [{"name": "ledger", "mountPath": data_dir}]
    assert docs["StatefulSet"]["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "ledger"
    for key, value in docs["ConfigMap"]["data"].items():
        monkeypatch.setenv(key, value)
    config = load(BotSettings).bot_kubernetes
    assert config.dcgm_diag_command[:3] == ["dcgmi", "diag", "--host"] and not config.noexecute_on_immediate


def test_the_cluster_is_named_by_kube_system_s_uid(api):
    api.on("GET", "/api/v1/namespaces/kube-system",
           (200, {"kind": "Namespace", "apiVersion": "v1",
                  "metadata": {"name": "kube-system", "uid": "3f6e9a1c-8b2d-4c7e-a0f1-5d4b3c2a1908"}}))
    assert asyncio.run(executor(api).cluster_id()) == "3f6e9a1c"
