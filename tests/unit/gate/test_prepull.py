"""Pre-pull: the gate approves once the node has the staged release's image, not before.

The kubelet's part (pulling, then writing the container's state into the pod's status) is done
here as the kubelet writes it (core/v1 ContainerStatus: state.waiting.reason, state.terminated).
"""

from __future__ import annotations

from typing import Any

from conftest import NAMESPACE, STAGED, Cluster

from nvidia_driver.gate.gate import Gate
from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, TRUE
from nvidia_driver.gate.prepull import NO_OP, NODE_LABEL, PrePull

NODE = "gpu-1"
TAG = f"610.57.04-flatcar{STAGED}"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def _gate(cluster: Cluster) -> Gate:
    cluster.add_node(NODE)
    cluster.cluster_policy("610.57.04")
    cluster.publish("610.57.04-flatcar4593.2.4")
    cluster.api.edit(f"/api/v1/nodes/{NODE}", _asked_about(STAGED))
    gate = cluster.gate(NODE)
    gate.prepull = PrePull(gate.api, NAMESPACE, NODE)
    return gate


def _asked_about(version: str) -> Any:
    def change(node: dict[str, Any]) -> None:
        node["metadata"].setdefault("labels", {})[BEFORE_REBOOT] = TRUE
        node["metadata"].setdefault("annotations", {})[NEW_VERSION] = version

    return change


def _kubelet(cluster: Cluster, pod: dict[str, Any], state: dict[str, Any]) -> None:
    def change(stored: dict[str, Any]) -> None:
        stored["status"] = {"phase": "Pending", "containerStatuses": [
            {"name": "pull", "image": pod["spec"]["containers"][0]["image"], "state": state}
        ]}  # fmt: skip

    cluster.api.edit(f"{PODS}/{pod['metadata']['name']}", change)


def test_a_published_image_is_pulled_onto_the_node_before_the_reboot_goes(
    cluster: Cluster,
) -> None:
    gate = _gate(cluster)
    cluster.publish(TAG)
    verdict = gate.step()
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.line.endswith(f"pulling {cluster.repository}/driver:{TAG} onto the node")
    [pod] = cluster.api.items(PODS)
    spec = pod["spec"]
    assert spec["nodeName"] == NODE
    assert pod["metadata"]["labels"][NODE_LABEL] == NODE
    [container] = spec["containers"]
    assert container["image"] == f"{cluster.repository}/driver:{TAG}"
    assert container["command"] == list(NO_OP)
    assert spec["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert APPROVAL not in cluster.node(NODE)["metadata"]["annotations"]

    _kubelet(cluster, pod, {"terminated": {"exitCode": 0, "reason": "Completed"}})
    verdict = gate.step()
    assert verdict is not None
    assert verdict.allowed, verdict.line
    assert verdict.line.endswith("published; on the node")
    assert cluster.node(NODE)["metadata"]["annotations"][APPROVAL] == TRUE
    assert len(cluster.api.items(PODS)) == 1  # kept: the image stays in use until the reboot


def test_a_node_that_cannot_pull_holds_and_says_why(cluster: Cluster) -> None:
    gate = _gate(cluster)
    cluster.publish(TAG)
    gate.step()
    [pod] = cluster.api.items(PODS)
    _kubelet(cluster, pod, {"waiting": {"reason": "ImagePullBackOff",
                                        "message": "Back-off pulling image"}})  # fmt: skip
    verdict = gate.step()
    assert verdict is not None
    assert not verdict.allowed
    assert "the node cannot pull" in verdict.line
    assert "ImagePullBackOff: Back-off pulling image" in verdict.line


def test_a_newer_staged_release_replaces_the_pre_pull_of_the_older(cluster: Cluster) -> None:
    gate = _gate(cluster)
    assert gate.prepull is not None
    older, newer = f"{cluster.repository}/driver:a", f"{cluster.repository}/driver:b"
    assert gate.prepull.waiting([older]) == f"pulling {older} onto the node"
    assert gate.prepull.waiting([newer]) == f"pulling {newer} onto the node"
    [pod] = cluster.api.items(PODS)
    assert pod["spec"]["containers"][0]["image"] == newer
