"""Pre-pull on the fake API server: what a kubelet writes into the pod's status that the real
server's cluster tests do not (tests/integration/cluster/decisions/test_gate_prepull.py)."""

from __future__ import annotations

from typing import Any

from conftest import NAMESPACE, Cluster

from nvidia_driver.gate.prepull import PrePull

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def test_a_pod_the_kubelet_refused_is_made_again_and_the_line_says_why(cluster: Cluster) -> None:
    """The kubelet's admission (OutOfpods, OutOfmemory, a device plugin's error) fails a pod
    before any container is made: phase Failed, its reason, no container statuses (kubelet
    rejectPod). That pod never pulls; a new one may get in."""
    prepull = PrePull(cluster.api_client(), NAMESPACE, "gpu-1")
    image = f"{cluster.repository}/driver:610.57.04-flatcar4593.2.5"
    assert prepull.waiting([image]) == f"pulling {image} onto the node"
    [pod] = cluster.api.items(PODS)

    def refused(stored: dict[str, Any]) -> None:
        message = "Pod was rejected: Node didn't have enough resource: pods"
        stored["status"] = {"phase": "Failed", "reason": "OutOfpods", "message": message}

    cluster.api.edit(f"{PODS}/{pod['metadata']['name']}", refused)
    line = prepull.waiting([image])
    assert line == (
        f"the node refused the pod that pulls {image} (OutOfpods: Pod was rejected: Node didn't "
        "have enough resource: pods); it is made again"
    )
    assert cluster.api.items(PODS) == []
    assert prepull.waiting([image]) == f"pulling {image} onto the node"
    [again] = cluster.api.items(PODS)
    assert "status" not in again
