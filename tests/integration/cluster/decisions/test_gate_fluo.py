"""The gate as FLUO's before-reboot hook, on the real kube-apiserver: its own node, the
Deployment's share, the Events it leaves, what holds.

A node is asked about as FLUO leaves it when the gate's turn comes (gate_cluster.fluo_asks);
FLUO's own flow runs for real in test_fluo_flow.py and test_fluo_without_gpus.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from gate_cluster import GateCluster, fluo_asks
from gate_store import gate_requests

from nvidia_driver.gate.gate import Gate
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


def _before_the_gates_first_patch(gate: Gate, happen: Callable[[str], None]) -> None:
    """Let something happen just before the gate's first PATCH leaves: the race FLUO's agent
    (or anyone) wins against the gate, which the real server then answers 409."""
    patch = gate.api.merge_patch

    def racing(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        gate.api.merge_patch = patch  # type: ignore[method-assign] - once
        happen(path)
        return patch(path, body)

    gate.api.merge_patch = racing  # type: ignore[method-assign]


def test_a_node_that_changed_under_the_gate_is_read_and_judged_again(
    gpu_cluster: GateCluster,
) -> None:
    """The approval carries the resourceVersion it was decided on, so the real API server
    answers 409 when the node changed since; the gate decides on the new node."""
    gpu_cluster.published()
    gpu_cluster.api.edit("/api/v1/nodes/gpu-1", fluo_asks())
    gate = gpu_cluster.gate("gpu-1")
    checked = {"flatcar-linux-update.v1.flatcar-linux.net/last-checked-time": "1786000300"}
    _before_the_gates_first_patch(gate, lambda path: gpu_cluster.api.edit(
        path, lambda n: n["metadata"]["annotations"].update(checked)))  # fmt: skip
    verdict = gate.step()
    assert verdict is not None
    assert verdict.allowed
    patches = [a for a in gate_requests(gpu_cluster) if a == ("patch", "/api/v1/nodes/gpu-1")]
    assert len(patches) == 2  # the first answered 409
    assert gpu_cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_a_node_fluo_no_longer_asks_about_is_left_alone(gpu_cluster: GateCluster) -> None:
    """FLUO's cleanupState took the label while the gate looked: the real server's 409, and
    then nothing to decide."""
    gpu_cluster.published()
    gpu_cluster.api.edit("/api/v1/nodes/gpu-1", fluo_asks())
    gate = gpu_cluster.gate("gpu-1")
    _before_the_gates_first_patch(gate, lambda path: gpu_cluster.api.edit(
        path, lambda n: n["metadata"]["labels"].pop(BEFORE_REBOOT)))  # fmt: skip
    assert gate.step() is None
    assert APPROVAL not in gpu_cluster.node("gpu-1")["metadata"]["annotations"]
