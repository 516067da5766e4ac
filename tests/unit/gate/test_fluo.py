"""The gate as FLUO's before-reboot hook: FLUO's flow, conflicts, failures that hold."""

from __future__ import annotations

import yaml
from conftest import DEPLOY, STAGED, Cluster
from fake_apiserver import Fault
from fluo_sim import BEFORE_REBOOT, NEW_VERSION, Agent, Client, Operator

from nvidia_driver.cli import parser
from nvidia_driver.gate.gate import Gate
from nvidia_driver.gate.managers import APPROVAL, VERDICT, Manager

NEW = "610.57.04-flatcar4593.2.5"


def _fluo(cluster: Cluster) -> tuple[Operator, Client]:
    client = Client(cluster.api.url)
    return Operator(client, before_reboot_annotations=[APPROVAL]), client


def _asked_with_its_image_published(cluster: Cluster) -> None:
    """gpu-1's agent stages 4593.2.5, whose image exists; FLUO labels it before-reboot."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish(NEW)
    operator, client = _fluo(cluster)
    Agent(client, "gpu-1").update_engine_staged(STAGED)
    operator.process()


def _deployed(cluster: Cluster) -> list[Gate]:
    """The FLUO variant's gate pods, placed as the scheduler places deploy/reboot-gate/fluo on
    the cluster's nodes: a DaemonSet's on every node its nodeSelector takes, a Deployment's
    replicas on any node; each runs as its container's args say."""
    nodes = cluster.api.items("/api/v1/nodes")
    gates = []
    for path in sorted((DEPLOY / "fluo").glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        if document["kind"] not in {"DaemonSet", "Deployment"}:
            continue
        pod = document["spec"]["template"]["spec"]
        [container] = pod["containers"]
        args = parser().parse_args(container["args"])
        selector = pod.get("nodeSelector", {})
        taking = [
            node["metadata"]["name"]
            for node in nodes
            if all(node["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]
        if document["kind"] == "Deployment":
            taking = taking[:1] * document["spec"]["replicas"]
        gates += [cluster.gate(name, Manager(args.manager), others=args.others) for name in taking]
    return gates


def _update(cluster: Cluster, names: list[str]) -> list[str]:
    """Every node stages STAGED; FLUO and the deployed gates run until no node may reboot any
    more: the nodes in the order they rebooted."""
    operator, client = _fluo(cluster)
    for name in names:
        Agent(client, name).update_engine_staged(STAGED)
    rebooted: list[str] = []
    for _ in range(4 * len(names)):
        operator.process()
        for gate in _deployed(cluster):
            gate.step()
        for name in names:
            if name not in rebooted and Agent(client, name).may_reboot():
                Agent(client, name).rebooted()
                rebooted.append(name)
    return rebooted


def test_a_cluster_without_gpu_nodes_updates_under_fluo(cluster: Cluster) -> None:
    """No GPU node (a GPU pool scaled to zero): no DaemonSet gate runs, and FLUO still waits
    for the gate's annotation on every node it picks. The Deployment approves them."""
    names = ["cpu-1", "cpu-2", "cpu-3"]
    for name in names:
        cluster.add_node(name, gpu=False)
    assert sorted(_update(cluster, names)) == names
    annotations = cluster.node("cpu-1")["metadata"]["annotations"]
    assert annotations[VERDICT] == "allowed: not a GPU node (no nvidia.com/gpu.present=true label)"


def test_gpu_nodes_the_operator_installs_no_driver_on_update_without_their_gates(
    cluster: Cluster,
) -> None:
    """The Operator not installed, and the gate's DaemonSet gone: the Deployment approves."""
    names = ["gpu-1", "gpu-2"]
    for name in names:
        cluster.add_node(name)
    cluster.api.not_installed |= {"clusterpolicies", "nvidiadrivers", "gpuclusters"}
    operator, client = _fluo(cluster)
    Agent(client, "gpu-1").update_engine_staged(STAGED)
    operator.process()
    [deployment] = [gate for gate in _deployed(cluster) if gate.settings.others]
    deployment.step()
    assert cluster.node("gpu-1")["metadata"]["annotations"][VERDICT] == (
        "allowed: the GPU Operator is not installed (no ClusterPolicy or NVIDIADriver CRD)"
    )


def test_the_deployment_leaves_a_gpu_node_with_a_driver_to_its_own_gate(cluster: Cluster) -> None:
    """Only the node's own gate may approve it: the Deployment never judges an image."""
    cluster.add_node("gpu-1")
    cluster.add_node("cpu-1", gpu=False)
    cluster.cluster_policy("610.57.04")
    # cpu-1 goes (the Deployment), then gpu-1 is held (its own gate): FLUO halts there
    assert _update(cluster, ["gpu-1", "cpu-1"]) == ["cpu-1"]
    assert APPROVAL not in cluster.node("gpu-1")["metadata"]["annotations"]
    cluster.publish(NEW)
    operator, client = _fluo(cluster)
    for gate in _deployed(cluster):
        gate.step()
    operator.process()
    assert Agent(client, "gpu-1").may_reboot()


def test_a_held_gpu_node_halts_fluo_until_its_image_is_published(cluster: Cluster) -> None:
    """maxRebootingNodes is 1: a node with before-reboot=true keeps the others waiting."""
    cluster.add_node("gpu-1")
    cluster.add_node("gpu-2")
    cluster.cluster_policy("610.57.04")
    operator, client = _fluo(cluster)
    for name in ("gpu-1", "gpu-2"):
        Agent(client, name).update_engine_staged(STAGED)
    operator.process()
    labelled = [
        name
        for name in ("gpu-1", "gpu-2")
        if BEFORE_REBOOT in cluster.node(name)["metadata"]["labels"]
    ]
    assert labelled == ["gpu-1"]
    for name in ("gpu-1", "gpu-2"):
        cluster.gate(name).step()
    operator.process()
    assert BEFORE_REBOOT not in cluster.node("gpu-2")["metadata"]["labels"]
    cluster.publish(NEW)
    cluster.gate("gpu-1").step()
    operator.process()
    assert Agent(client, "gpu-1").may_reboot()


def test_a_node_that_changed_under_the_gate_is_read_and_judged_again(cluster: Cluster) -> None:
    """The approval carries the resourceVersion it was decided on: the API server answers 409
    when FLUO (or anyone) changed the node since, and the gate decides on the new node."""
    _asked_with_its_image_published(cluster)
    changed = []

    def meanwhile(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1" and not changed:
            changed.append(path)  # the agent's next status update lands first
            cluster.api.edit(
                path,
                lambda n: n["metadata"]["annotations"].update(
                    {"flatcar-linux-update.v1.flatcar-linux.net/last-checked-time": "1786000300"}
                ),
            )

    cluster.api.before_write = meanwhile
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert verdict.allowed
    patches = [e for e in cluster.api.log if e[:2] == ("PATCH", "/api/v1/nodes/gpu-1")]
    assert len(patches) == 2  # the first answered 409
    assert all(content_type == "application/merge-patch+json" for *_, content_type in patches)
    assert cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_a_node_fluo_no_longer_asks_about_is_left_alone(cluster: Cluster) -> None:
    """cleanupState took the label (and the annotations) while the gate looked."""
    _asked_with_its_image_published(cluster)

    def cleanup(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1":
            cluster.api.edit(path, lambda n: n["metadata"]["labels"].pop(BEFORE_REBOOT))

    cluster.api.before_write = cleanup
    assert cluster.gate("gpu-1").step() is None
    assert APPROVAL not in cluster.node("gpu-1")["metadata"]["annotations"]


def test_api_server_5xx_answers_are_retried(cluster: Cluster) -> None:
    cluster.add_node("gpu-1", labels={BEFORE_REBOOT: "true"})
    cluster.api.edit(
        "/api/v1/nodes/gpu-1", lambda n: n["metadata"]["annotations"].update({NEW_VERSION: STAGED})
    )
    cluster.cluster_policy("610.57.04")
    cluster.publish(NEW)
    cluster.api.faults += [
        Fault("GET", "/api/v1/nodes/gpu-1", 503, times=2),
        Fault("PATCH", "/api/v1/nodes/gpu-1", 500),
    ]
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert verdict.allowed
    assert cluster.sleeps == [0.5, 1.0, 0.5]  # two GETs, one PATCH retried after a pause
    assert cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_what_cannot_be_checked_holds_the_reboot_and_says_why(cluster: Cluster) -> None:
    cluster.add_node("gpu-1", labels={BEFORE_REBOOT: "true"})
    cluster.api.edit(
        "/api/v1/nodes/gpu-1", lambda n: n["metadata"]["annotations"].update({NEW_VERSION: STAGED})
    )
    cluster.cluster_policy("610.57.04")
    cluster.api.faults.append(Fault("GET", "/apis/nvidia.com/v1/clusterpolicies", 500, times=9))
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.line == (
        f"flatcar {STAGED}: cannot check its driver image: Kubernetes API: "
        "GET /apis/nvidia.com/v1/clusterpolicies answered 500: injected fault"
    )
    assert APPROVAL not in cluster.node("gpu-1")["metadata"]["annotations"]


def test_a_new_version_that_is_no_flatcar_release_holds(cluster: Cluster) -> None:
    cluster.add_node("gpu-1", labels={BEFORE_REBOOT: "true"})
    cluster.api.edit(
        "/api/v1/nodes/gpu-1",
        lambda n: n["metadata"]["annotations"].update({NEW_VERSION: "0.0.0\nRebootAllowed"}),
    )
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    assert "\n" not in verdict.line
    assert verdict.line.startswith("the staged release '0.0.0\\nRebootAllowed' is not a Flatcar")
