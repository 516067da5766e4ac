"""The gate as FLUO's before-reboot hook, where the API server fails it (injected): races,
refusals, 5xx, CRDs that are not installed.

Its decisions run against the real kube-apiserver (tests/integration/cluster/decisions), FLUO's
own flow in tests/integration/cluster (test_fluo_flow.py, test_fluo_without_gpus.py).
"""

from __future__ import annotations

import pytest
from conftest import STAGED, Cluster
from fake_apiserver import Fault
from gate_cluster import fluo_asks

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, VERDICT

NEW = "610.57.04-flatcar4593.2.5"
# What answers 404 when the GPU Operator's CRDs are not installed.
OPERATOR_CRDS = (
    "/apis/nvidia.com/v1/clusterpolicies",
    "/apis/nvidia.com/v1alpha1/nvidiadrivers",
    "/apis/nvidia.com/v1alpha1/gpuclusters",
)


def test_the_deployment_approves_gpu_nodes_the_operator_installs_no_driver_on(
    cluster: Cluster,
) -> None:
    """The Operator not installed (its CRDs answer 404), and so no gate DaemonSet pod."""
    cluster.add_node("gpu-1")
    cluster.api.edit("/api/v1/nodes/gpu-1", fluo_asks())
    cluster.api.faults += [Fault("GET", path, 404, times=10) for path in OPERATOR_CRDS]
    cluster.others_gate().step()
    annotations = cluster.node("gpu-1")["metadata"]["annotations"]
    assert annotations[VERDICT] == (
        "allowed: the GPU Operator is not installed (no ClusterPolicy or NVIDIADriver CRD)"
    )
    assert annotations[APPROVAL] == "true"


def test_an_event_the_api_server_refuses_is_said_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The annotation carries the verdict still; the lost event is not lost silently."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.api.edit("/api/v1/nodes/gpu-1", fluo_asks())
    cluster.api.faults.append(Fault("POST", "/api/v1/namespaces/default/events", 403))
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    [line] = [line for line in capsys.readouterr().out.splitlines() if "event" in line]
    assert line.startswith("WARNING: reboot gate: cannot record the event: Kubernetes API: POST ")


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
