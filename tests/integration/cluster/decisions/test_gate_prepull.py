"""Pre-pull: the gate approves once the node has the staged release's image, not before.

The kubelet's part (pulling, then writing the container's state into the pod's status) is done
here as the kubelet writes it (core/v1 ContainerStatus: state.waiting.reason, state.terminated),
through the real API server's pods/status.
"""

from __future__ import annotations

from typing import Any

import pytest
from gate_cluster import NAMESPACE, STAGED, GateCluster, fluo_asks

from nvidia_driver.gate.gate import Gate
from nvidia_driver.gate.managers import APPROVAL, TRUE
from nvidia_driver.gate.prepull import NO_OP, NODE_LABEL, PrePull

NODE = "gpu-1"
TAG = f"610.57.04-flatcar{STAGED}"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"

pytestmark = pytest.mark.cluster


def _gate(gpu_cluster: GateCluster) -> Gate:
    gpu_cluster.add_node(NODE)
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish("610.57.04-flatcar4593.2.4")
    gpu_cluster.api.edit(f"/api/v1/nodes/{NODE}", fluo_asks(STAGED))
    gate = gpu_cluster.gate(NODE)
    gate.prepull = PrePull(gate.api, NAMESPACE, NODE)
    return gate


def _kubelet(gpu_cluster: GateCluster, pod: dict[str, Any], state: dict[str, Any]) -> None:
    def change(stored: dict[str, Any]) -> None:
        stored["status"] = {"phase": "Pending", "containerStatuses": [
            {"name": "pull", "image": pod["spec"]["containers"][0]["image"], "state": state}
        ]}  # fmt: skip

    gpu_cluster.api.edit(f"{PODS}/{pod['metadata']['name']}", change)


def test_a_published_image_is_pulled_onto_the_node_before_the_reboot_goes(
    gpu_cluster: GateCluster,
) -> None:
    gate = _gate(gpu_cluster)
    gpu_cluster.publish(TAG)
    verdict = gate.step()
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.line.endswith(f"pulling {gpu_cluster.repository}/driver:{TAG} onto the node")
    [pod] = gpu_cluster.api.items(PODS)
    spec = pod["spec"]
    assert spec["nodeName"] == NODE
    assert pod["metadata"]["labels"][NODE_LABEL] == NODE
    [container] = spec["containers"]
    assert container["image"] == f"{gpu_cluster.repository}/driver:{TAG}"
    assert container["command"] == list(NO_OP)
    assert spec["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert APPROVAL not in gpu_cluster.node(NODE)["metadata"]["annotations"]

    _kubelet(gpu_cluster, pod, {"terminated": {"exitCode": 0, "reason": "Completed"}})
    verdict = gate.step()
    assert verdict is not None
    assert verdict.allowed, verdict.line
    assert verdict.line.endswith("published; on the node")
    assert gpu_cluster.node(NODE)["metadata"]["annotations"][APPROVAL] == TRUE
    assert len(gpu_cluster.api.items(PODS)) == 1  # kept: the image stays in use until the reboot


def test_a_node_that_cannot_pull_holds_and_says_why(gpu_cluster: GateCluster) -> None:
    gate = _gate(gpu_cluster)
    gpu_cluster.publish(TAG)
    gate.step()
    [pod] = gpu_cluster.api.items(PODS)
    _kubelet(gpu_cluster, pod, {"waiting": {"reason": "ImagePullBackOff",
                                        "message": "Back-off pulling image"}})  # fmt: skip
    verdict = gate.step()
    assert verdict is not None
    assert not verdict.allowed
    assert "the node cannot pull" in verdict.line
    assert "ImagePullBackOff: Back-off pulling image" in verdict.line


def test_a_start_failure_the_kubelet_gives_as_its_error_text_holds_and_says_it(
    gpu_cluster: GateCluster,
) -> None:
    """A container that cannot start waits with its error's text as the reason, not one of the
    pull reasons (kubernetes v1.36 kubelet_pods.go: the reason cache's ``Err.Error()``): e.g. a
    pull secret the kubelet cannot read fails every pull with Go's base64 error
    (images/image_manager.go)."""
    gate = _gate(gpu_cluster)
    gpu_cluster.publish(TAG)
    gate.step()
    [pod] = gpu_cluster.api.items(PODS)
    _kubelet(gpu_cluster, pod, {"waiting": {"reason": "illegal base64 data at input byte 4"}})
    verdict = gate.step()
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.line.endswith(
        f"pulling {gpu_cluster.repository}/driver:{TAG} onto the node; the kubelet says: "
        "illegal base64 data at input byte 4"
    )


def test_a_newer_staged_release_replaces_the_pre_pull_of_the_older(
    gpu_cluster: GateCluster,
) -> None:
    gate = _gate(gpu_cluster)
    assert gate.prepull is not None
    older, newer = f"{gpu_cluster.repository}/driver:a", f"{gpu_cluster.repository}/driver:b"
    assert gate.prepull.waiting([older]) == f"pulling {older} onto the node"
    assert gate.prepull.waiting([newer]) == f"pulling {newer} onto the node"
    [pod] = gpu_cluster.api.items(PODS)
    assert pod["spec"]["containers"][0]["image"] == newer
