"""The gate as FLUO's before-reboot hook, on the real kube-apiserver: its own node, the
Deployment's share, the Events it leaves, what holds.

A node is asked about as FLUO leaves it when the gate's turn comes (gate_cluster.fluo_asks);
FLUO's own flow runs for real in test_fluo_flow.py and test_fluo_without_gpus.py.
"""

from __future__ import annotations

import pytest
from gate_cluster import GateCluster, fluo_asks

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, VERDICT

pytestmark = pytest.mark.cluster

NEW = "610.57.04-flatcar4593.2.5"


def test_the_deployment_leaves_a_gpu_node_with_a_driver_to_its_own_gate(
    gpu_cluster: GateCluster,
) -> None:
    """Only the node's own gate may approve it: the Deployment never judges an image."""
    for name, gpu in (("gpu-1", True), ("cpu-1", False)):
        gpu_cluster.add_node(name, gpu=gpu)
        gpu_cluster.api.edit(f"/api/v1/nodes/{name}", fluo_asks())
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish(NEW)
    gpu_cluster.others_gate().step()
    assert gpu_cluster.node("cpu-1")["metadata"]["annotations"][VERDICT] == (
        "allowed: not a GPU node (no nvidia.com/gpu.present=true label)"
    )
    assert gpu_cluster.node("cpu-1")["metadata"]["annotations"][APPROVAL] == "true"
    assert APPROVAL not in gpu_cluster.node("gpu-1")["metadata"]["annotations"]
    gpu_cluster.gate("gpu-1").step()
    assert gpu_cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_a_verdict_is_said_once_until_it_changes(gpu_cluster: GateCluster) -> None:
    """One RebootHeld while the image is missing, however often the gate looks; then one
    RebootAllowed."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.api.edit("/api/v1/nodes/gpu-1", fluo_asks())
    gate = gpu_cluster.gate("gpu-1")
    held = gate.step()
    assert gate.step() == held
    assert [e["reason"] for e in gpu_cluster.events()] == ["RebootHeld"]
    gpu_cluster.publish(NEW)
    assert gate.step() is not None
    assert [e["reason"] for e in gpu_cluster.events()] == ["RebootHeld", "RebootAllowed"]
    [event] = gpu_cluster.events()[1:]
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "uid": "gpu-1",  # as the kubelet's node events, which kubectl describe node looks up
    }
    assert gate.step() is None  # approved: the gate waits for FLUO's next question


def test_a_new_version_that_is_no_flatcar_release_holds(gpu_cluster: GateCluster) -> None:
    gpu_cluster.add_node("gpu-1", labels={BEFORE_REBOOT: "true"})
    gpu_cluster.api.edit(
        "/api/v1/nodes/gpu-1",
        lambda n: n["metadata"]["annotations"].update({NEW_VERSION: "0.0.0\nRebootAllowed"}),
    )
    verdict = gpu_cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    assert "\n" not in verdict.line
    assert verdict.line.startswith("the staged release '0.0.0\\nRebootAllowed' is not a Flatcar")
