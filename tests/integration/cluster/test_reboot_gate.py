"""The reboot gate against the real API server, with exactly deploy/reboot-gate's RBAC.

FLUO's side of the protocol is written here as its agent and operator write it (the node's
``before-reboot`` label and ``new-version`` annotation, flatcar-linux-update-operator
``pkg/constants``); the gate runs as its DaemonSet would, with its ServiceAccount's token.

* GPU Operator v26.7 drives NVIDIADriver resources with no ClusterPolicy at all: the gate must
  check the NVIDIADriver's image, not read "no ClusterPolicy" as "no driver".
* Its verdict must be an Event the real API server accepts about the Node, so that
  ``kubectl describe node`` shows it (core/v1 Events about a cluster-scoped object live in
  ``default``: the API server's ``legacyValidateEvent``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apiserver import APIError, Cluster
from fixtures.docker_env import Registry
from gate import gate_env, install, kubelet_pulled, node_event_reasons, push_image, run_gate_once
from gpu_operator import flatcar_node, install_operator, register_node, sample
from reboot_scenario import DRIVER, KERNEL, RUNNING, STAGED

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, VERDICT

pytestmark = pytest.mark.cluster

NODE = "gpu-v267"


@pytest.fixture(scope="module")
def nvidia_driver_only(cluster: Cluster, operator_module: Path, registry: Registry) -> Cluster:
    """The v26.7 mode: an NVIDIADriver selects the node; no ClusterPolicy exists."""
    install_operator(cluster, operator_module)
    install(cluster, "fluo")
    for policy in cluster.items("/apis/nvidia.com/v1/clusterpolicies"):
        cluster.request(
            "DELETE", f"/apis/nvidia.com/v1/clusterpolicies/{policy['metadata']['name']}"
        )
    driver = sample(operator_module, "nvidia_v1alpha1_nvidiadriver.yaml")
    driver["metadata"]["name"] = "flatcar-pool"
    driver["spec"].update({"repository": f"{registry.address}/gdc", "image": "driver",
                           "version": DRIVER,
                           "nodeSelector": {"kubernetes.io/hostname": NODE}})  # fmt: skip
    cluster.apply(driver)
    node = flatcar_node(NODE, RUNNING, KERNEL)
    node["metadata"]["labels"][BEFORE_REBOOT] = "true"
    node["metadata"]["annotations"] = {NEW_VERSION: STAGED}
    register_node(cluster, node)
    return cluster


def annotations(cluster: Cluster) -> dict[str, str]:
    return cluster.node_metadata(NODE, "annotations")


def test_the_api_server_refuses_a_node_event_outside_default(cluster: Cluster) -> None:
    """The fact the gate's events depend on (legacyValidateEvent), checked on the real server."""
    cluster.namespace("gdc-events")
    event = {"apiVersion": "v1", "kind": "Event",
             "metadata": {"name": "gdc-probe", "namespace": "gdc-events"},
             "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "gdc-probe"},
             "reason": "Probe", "message": "probe", "type": "Normal",
             "firstTimestamp": "2026-12-05T00:00:00Z", "lastTimestamp": "2026-12-05T00:00:00Z",
             "count": 1}  # fmt: skip
    with pytest.raises(APIError) as refused:
        cluster.request("POST", "/api/v1/namespaces/gdc-events/events", event)
    assert refused.value.status == 422
    event["metadata"]["namespace"] = "default"  # type: ignore[index]
    cluster.request("POST", "/api/v1/namespaces/default/events", event)


def test_nvidia_driver_without_cluster_policy_holds_until_the_image_exists(
    nvidia_driver_only: Cluster, registry: Registry, releases_feed: str, tmp_path: Path
) -> None:
    cluster = nvidia_driver_only
    env = gate_env(cluster, NODE, releases_feed, tmp_path)

    held = run_gate_once(cluster, env, tmp_path)
    assert held.returncode == 0, held.stderr
    said = annotations(cluster)
    assert said.get(APPROVAL) != "true", said
    assert "held" in said.get(VERDICT, ""), said
    reasons = node_event_reasons(cluster, NODE)
    assert "RebootHeld" in reasons, (reasons, held.stderr)

    image = push_image(registry.address, "gdc/driver", f"{DRIVER}-flatcar{STAGED}")
    pulling = run_gate_once(cluster, env, tmp_path)
    assert pulling.returncode == 0, pulling.stderr
    assert f"pulling {image} onto the node" in annotations(cluster)[VERDICT], pulling.stdout
    assert annotations(cluster).get(APPROVAL) != "true"
    assert kubelet_pulled(cluster, NODE) == [image]

    allowed = run_gate_once(cluster, env, tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    assert annotations(cluster).get(APPROVAL) == "true", (annotations(cluster), allowed.stderr)
    assert "RebootAllowed" in node_event_reasons(cluster, NODE)


def test_use_precompiled_holds_a_release_that_shares_another_nodes_kernel(
    nvidia_driver_only: Cluster, operator_module: Path, registry: Registry, releases_feed: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A ClusterPolicy with usePrecompiled; gpu-other runs stable 4459.2.0 (kernel 6.12.54), and
    the gate's node stages alpha 4515.0.0, on the same kernel: the real Operator would refuse the
    whole ClusterPolicy (test_operator_renders.py shows it), so the gate holds, naming both."""
    cluster = nvidia_driver_only
    policy = sample(operator_module, "v1_clusterpolicy.yaml")
    branch = DRIVER.split(".", maxsplit=1)[0]
    policy["spec"]["driver"].update({"repository": f"{registry.address}/gdc", "image": "driver",
                                     "version": branch, "usePrecompiled": True})  # fmt: skip
    cluster.apply(policy)
    register_node(cluster, flatcar_node("gpu-other", RUNNING, KERNEL))
    try:
        env = gate_env(cluster, NODE, releases_feed, tmp_path)
        cluster.request("PATCH", f"/api/v1/nodes/{NODE}",
                        {"metadata": {"annotations": {APPROVAL: None, VERDICT: None}}},
                        content_type="application/merge-patch+json")  # fmt: skip
        result = run_gate_once(cluster, env, tmp_path)
        assert result.returncode == 0, result.stderr
        said = annotations(cluster)
        assert said.get(APPROVAL) != "true", said
        line = said[VERDICT]
        assert line.startswith(f"held: flatcar {STAGED}"), line
        assert "gpu-other" in line, line
        assert RUNNING in line, line
        assert KERNEL in line, line
        assert "NVIDIADriver" in line, line
    finally:
        cluster.request(
            "DELETE", f"/apis/nvidia.com/v1/clusterpolicies/{policy['metadata']['name']}"
        )
        cluster.request("DELETE", "/api/v1/nodes/gpu-other")
