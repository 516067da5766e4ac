"""The gate as FLUO's before-reboot hook: races, failures that hold, the Deployment's share.

FLUO's own flow (its agent's and operator's labels and annotations, its selectors, its
maxRebootingNodes) runs for real in tests/integration/cluster (test_fluo_flow.py,
test_fluo_without_gpus.py). Here a node is asked about as FLUO leaves it when the gate's turn
comes: labelled before-reboot=true, with the agent's new-version annotation.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import DEPLOY, STAGED, Cluster
from fake_apiserver import Fault

from nvidia_driver.cli import parser
from nvidia_driver.gate.gate import Gate
from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, VERDICT, Manager

NEW = "610.57.04-flatcar4593.2.5"
# What answers 404 when the GPU Operator's CRDs are not installed.
OPERATOR_CRDS = (
    "/apis/nvidia.com/v1/clusterpolicies",
    "/apis/nvidia.com/v1alpha1/nvidiadrivers",
    "/apis/nvidia.com/v1alpha1/gpuclusters",
)


def _asked(node: dict[str, Any]) -> None:
    """FLUO's operator asking: before-reboot=true, and the agent's new-version."""
    node["metadata"]["labels"][BEFORE_REBOOT] = "true"
    node["metadata"]["annotations"][NEW_VERSION] = STAGED


def _asked_with_its_image_published(cluster: Cluster) -> None:
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish(NEW)
    cluster.api.edit("/api/v1/nodes/gpu-1", _asked)


def _deployment(cluster: Cluster) -> Gate:
    """The FLUO variant's Deployment (``reboot-gate --others``), run as its container's args
    say."""
    document = yaml.safe_load((DEPLOY / "fluo" / "0600_deployment.yaml").read_text())
    [container] = document["spec"]["template"]["spec"]["containers"]
    args = parser().parse_args(container["args"])
    assert args.others
    return cluster.gate("", Manager(args.manager), others=args.others)


def test_the_deployment_approves_gpu_nodes_the_operator_installs_no_driver_on(
    cluster: Cluster,
) -> None:
    """The Operator not installed (its CRDs answer 404), and so no gate DaemonSet pod."""
    cluster.add_node("gpu-1")
    cluster.api.edit("/api/v1/nodes/gpu-1", _asked)
    cluster.api.faults += [Fault("GET", path, 404, times=10) for path in OPERATOR_CRDS]
    _deployment(cluster).step()
    annotations = cluster.node("gpu-1")["metadata"]["annotations"]
    assert annotations[VERDICT] == (
        "allowed: the GPU Operator is not installed (no ClusterPolicy or NVIDIADriver CRD)"
    )
    assert annotations[APPROVAL] == "true"


def test_the_deployment_leaves_a_gpu_node_with_a_driver_to_its_own_gate(cluster: Cluster) -> None:
    """Only the node's own gate may approve it: the Deployment never judges an image."""
    for name, gpu in (("gpu-1", True), ("cpu-1", False)):
        cluster.add_node(name, gpu=gpu)
        cluster.api.edit(f"/api/v1/nodes/{name}", _asked)
    cluster.cluster_policy("610.57.04")
    cluster.publish(NEW)
    _deployment(cluster).step()
    assert cluster.node("cpu-1")["metadata"]["annotations"][VERDICT] == (
        "allowed: not a GPU node (no nvidia.com/gpu.present=true label)"
    )
    assert cluster.node("cpu-1")["metadata"]["annotations"][APPROVAL] == "true"
    assert APPROVAL not in cluster.node("gpu-1")["metadata"]["annotations"]
    cluster.gate("gpu-1").step()
    assert cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_a_verdict_is_said_once_until_it_changes(cluster: Cluster) -> None:
    """One RebootHeld while the image is missing, however often the gate looks; then one
    RebootAllowed."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.api.edit("/api/v1/nodes/gpu-1", _asked)
    gate = cluster.gate("gpu-1")
    held = gate.step()
    assert gate.step() == held
    assert [e["reason"] for e in cluster.events()] == ["RebootHeld"]
    cluster.publish(NEW)
    assert gate.step() is not None
    assert [e["reason"] for e in cluster.events()] == ["RebootHeld", "RebootAllowed"]
    [event] = cluster.events()[1:]
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "uid": "gpu-1",
    }
    assert gate.step() is None  # approved: the gate waits for FLUO's next question


def test_an_event_the_api_server_refuses_is_said_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The annotation carries the verdict still; the lost event is not lost silently."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.api.edit("/api/v1/nodes/gpu-1", _asked)
    cluster.api.faults.append(Fault("POST", "/api/v1/namespaces/default/events", 403))
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    [line] = [line for line in capsys.readouterr().out.splitlines() if "event" in line]
    assert line.startswith("WARNING: reboot gate: cannot record the event: Kubernetes API: POST ")


def test_a_node_that_changed_under_the_gate_is_read_and_judged_again(cluster: Cluster) -> None:
    """The approval carries the resourceVersion it was decided on, so the API server answers
    409 when FLUO (or anyone) changed the node since; the gate decides on the new node. The
    race is injected: the node changes just before the gate's write, which answers 409."""
    _asked_with_its_image_published(cluster)

    def meanwhile(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1":
            cluster.api.faults.append(Fault("PATCH", path, 409))
            cluster.api.before_write = None
            cluster.api.edit(
                path,
                lambda n: n["metadata"]["annotations"].update(
                    {"flatcar-linux-update.v1.flatcar-linux.net/last-checked-time": "1786000300"}
                ),
            )  # the agent's next status update lands first

    cluster.api.before_write = meanwhile
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert verdict.allowed
    patches = [e for e in cluster.api.log if e[:2] == ("PATCH", "/api/v1/nodes/gpu-1")]
    assert len(patches) == 2  # the first answered 409
    assert all(content_type == "application/merge-patch+json" for *_, content_type in patches)
    assert cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"


def test_a_node_fluo_no_longer_asks_about_is_left_alone(cluster: Cluster) -> None:
    """cleanupState took the label (and the annotations) while the gate looked: a 409."""
    _asked_with_its_image_published(cluster)

    def cleanup(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1":
            cluster.api.faults.append(Fault("PATCH", path, 409))
            cluster.api.before_write = None
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
