"""What the gate decides in each GPU Operator mode: its objects in the real kube-apiserver, read
with deploy/reboot-gate's ServiceAccount, against a registry and Flatcar's feed."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from gate_cluster import CLUSTER_POLICY, STAGED, GateCluster
from gate_store import gate_requests

from nvidia_driver.gate.verdict import allowed, held

pytestmark = pytest.mark.cluster

B, KB = STAGED, "6.12.102-flatcar"
# What update_engine saves of Omaha's answer (omaha_request_action.cc kPrefsFullResponse);
# the staged release is the manifest's version (/response/app/updatecheck/manifest).
OMAHA_RESPONSE = (
    '<?xml version="1.0" encoding="UTF-8"?><response protocol="3.0" server="update.release.'
    'flatcar-linux.net"><daystart elapsed_seconds="0"></daystart><app appid="{e96281a6-d1af-4bde-'
    '9a0a-97b76e56dc57}" status="ok"><updatecheck status="ok"><urls><url codebase="https://update'
    f'.release.flatcar-linux.net/amd64-usr/{B}/"></url></urls><manifest version="{B}"><packages>'
    '<package name="flatcar_production_update.gz" hash="x" size="1" required="false"></package>'
    "</packages></manifest></updatecheck></app></response>"
)


def test_clusterpolicy_default_mode_wants_the_staged_release_tag_on_every_arch(
    gpu_cluster: GateCluster,
) -> None:
    """One DaemonSet for every GPU node: once a node on B is listed first, all pull B's tag."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.add_node("gpu-2", arch="arm64")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish(f"610.57.04-flatcar{B}", ("amd64",))
    image = f"{gpu_cluster.repository}/driver:610.57.04-flatcar{B}"
    assert gpu_cluster.judge() == held(f"flatcar {B}: {image} has no linux/arm64 image")
    gpu_cluster.publish(f"610.57.04-flatcar{B}", ("amd64", "arm64"))
    assert gpu_cluster.judge() == allowed(
        f"flatcar {B}: {gpu_cluster.repository}/driver:610.57.04-flatcar{B} published"
    )


def test_nvidiadriver_pools_want_only_the_nodes_own_release(gpu_cluster: GateCluster) -> None:
    """One DaemonSet per release (and kernel): the node joins B's pool, nothing else moves."""
    owner = {"nvidia.com/gpu-operator.driver.owner": "flatcar"}
    gpu_cluster.add_node("gpu-1", labels=owner)
    gpu_cluster.add_node("gpu-2", arch="arm64", labels=owner)
    gpu_cluster.cluster_policy("unused", crd=True)
    gpu_cluster.nvidia_driver("flatcar", "610", usePrecompiled=True)
    gpu_cluster.publish(f"610-{KB}-flatcar{B}")
    assert gpu_cluster.judge() == allowed(
        f"flatcar {B}: {gpu_cluster.repository}/driver:610-{KB}-flatcar{B} published"
    )
    assert not any(path.endswith("/api/v1/nodes") for _, path in gate_requests(gpu_cluster))


def test_an_nvidiadriver_is_found_by_its_node_selector_without_the_owner_label(
    gpu_cluster: GateCluster,
) -> None:
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("unused", crd=True)
    gpu_cluster.nvidia_driver(
        "flatcar",
        "610.57.04",
        nodeSelector={"feature.node.kubernetes.io/system-os_release.ID": "flatcar"},
    )
    gpu_cluster.nvidia_driver(
        "ubuntu",
        "610.57.04",
        nodeSelector={"feature.node.kubernetes.io/system-os_release.ID": "ubuntu"},
    )
    assert gpu_cluster.judge() == held(
        f"flatcar {B}: {gpu_cluster.repository}/driver:610.57.04-flatcar{B} not published yet"
    )


@pytest.mark.parametrize(
    ("policy", "line"),
    [
        (
            {"enabled": False},
            (
                "ClusterPolicy cluster-policy has driver.enabled=false: the Operator installs no "
                "driver"
            ),
        ),
        (None, "no ClusterPolicy and no NVIDIADriver: the GPU Operator installs no driver"),
    ],
)
def test_a_cluster_whose_operator_installs_no_driver_reboots_freely(
    gpu_cluster: GateCluster, policy: dict[str, Any] | None, line: str
) -> None:
    gpu_cluster.add_node("gpu-1")
    if policy is not None:
        spec = {**gpu_cluster.policy_spec, "driver": policy}
        gpu_cluster.api.put(CLUSTER_POLICY, {"spec": spec})
    assert gpu_cluster.judge() == allowed(f"flatcar {B}: {line}")


@pytest.mark.parametrize("with_gpu_cluster", [True, False])
def test_nvidiadrivers_without_a_clusterpolicy_are_checked(
    gpu_cluster: GateCluster, with_gpu_cluster: bool, request: pytest.FixtureRequest
) -> None:
    """v26.7 reconciles NVIDIADrivers when no ClusterPolicy exists (GPUCluster mode,
    controllers/nvidiadriver_controller.go): 'no ClusterPolicy' is no longer 'no driver'."""
    gpu_cluster.add_node("gpu-1", labels={"nvidia.com/gpu-operator.driver.owner": "flatcar"})
    if with_gpu_cluster:
        request.getfixturevalue("gpu_clusters")  # else its CRD answers 404, as before v26.7
        gpu_cluster.gpu_cluster()
    gpu_cluster.nvidia_driver("flatcar", "610.57.04")
    assert gpu_cluster.judge() == held(
        f"flatcar {B}: {gpu_cluster.repository}/driver:610.57.04-flatcar{B} not published yet"
    )
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    assert gpu_cluster.judge().allowed


@pytest.mark.usefixtures("gpu_clusters")
def test_a_clusterpolicy_beside_a_gpucluster_holds(gpu_cluster: GateCluster) -> None:
    """The ClusterPolicy controller refuses to reconcile while a GPUCluster exists."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    gpu_cluster.gpu_cluster()
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert "ClusterPolicy cluster-policy and GPUCluster gpu-cluster both exist" in verdict.line


def test_a_digest_asks_for_no_tag_and_the_build_is_checked(gpu_cluster: GateCluster) -> None:
    """driver.version=sha256:...: the Operator appends nothing; a kernel the driver's sources
    do not build on holds (the gate's own image, 560 here, has no patch for 6.12.97+)."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("sha256:" + "ab" * 32)
    api = gpu_cluster.api_client()
    checker = gpu_cluster.checker(api)
    checker.build.driver_version = "560.35.03"
    verdict = checker.verdict(gpu_cluster.node("gpu-1"), B)
    assert not verdict.allowed
    assert verdict.line.startswith(
        f"flatcar {B}: driver 560.35.03 kernel-open does not build "
        f"on kernel {KB}: it needs patch pci-resize-resource"
    )


def test_a_feed_without_the_staged_release_holds_until_it_lists_it(
    gpu_cluster: GateCluster,
) -> None:
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    listed = gpu_cluster.feed.pop(B)
    gpu_cluster.write_feed()
    assert gpu_cluster.judge() == held(
        f"flatcar {B}: not in Flatcar's releases feed "
        f"({gpu_cluster.feed_file.as_uri()}) yet, so its kernel is "
        "unknown"
    )
    gpu_cluster.feed[B] = listed
    gpu_cluster.write_feed()
    assert gpu_cluster.judge().allowed


def test_the_operators_pull_secret_opens_a_private_registry(gpu_cluster: GateCluster) -> None:
    gpu_cluster.registry.username, gpu_cluster.registry.password = "robot", "s3cret"
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04", secrets=("driver-pull-secret",))
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    # The secret lives in the Operator's namespace (deploy/reboot-gate/pull-secrets lets the
    # gate read it).
    auth = base64.b64encode(b"robot:s3cret").decode()
    config = json.dumps({"auths": {gpu_cluster.registry.host: {"auth": auth}}}).encode()
    gpu_cluster.api.put(
        "/api/v1/namespaces/gpu-operator/secrets/driver-pull-secret",
        {
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()},
        },
    )
    assert gpu_cluster.judge().allowed
    assert gpu_cluster.registry.tokens_issued == ["repository:o/driver:pull"]


def test_a_pull_secret_name_that_is_no_kubernetes_name_holds_without_a_request(
    gpu_cluster: GateCluster,
) -> None:
    """The name is a segment of the request's path: '..' would make it another request."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04", secrets=("../../../nodes/gpu-1",))
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert verdict.line.endswith(
        "pull secret '../../../nodes/gpu-1', which is not a Kubernetes object name (lower-case "
        "letters, digits, '-' and '.', at most 253): correct imagePullSecrets in ClusterPolicy "
        "cluster-policy"
    )
    asked = [path for _, path in gate_requests(gpu_cluster) if "/secrets" in path or ".." in path]
    assert not asked


def test_a_registry_that_wants_credentials_the_gate_lacks_holds(gpu_cluster: GateCluster) -> None:
    gpu_cluster.registry.username, gpu_cluster.registry.password = "robot", "s3cret"
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    assert gpu_cluster.judge() == held(
        f"flatcar {B}: cannot check its driver image: "
        f"{gpu_cluster.repository}/driver:610.57.04-flatcar{B}: the registry gives no "
        "anonymous token, 401 (DENIED): set the GPU Operator's "
        "driver.imagePullSecrets and let the gate read them (docs/gpu-operator.md, "
        "the reboot gate's RBAC)"
    )


def test_a_broken_registry_holds(gpu_cluster: GateCluster) -> None:
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.registry.status = 503
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert verdict.line.endswith(
        f"/o/driver:610.57.04-flatcar{B}: the registry answered 503"  # to a HEAD: no body
    )


def test_a_policy_that_names_no_pullable_image_holds_in_one_line(gpu_cluster: GateCluster) -> None:
    """Text from the cluster never reaches the node's annotation or event with a line break."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04\nRebootAllowed")
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert "\n" not in verdict.line
    assert (
        "/driver:610.57.04\\nRebootAllowed-flatcar4593.2.5' is not an image reference the "
        "Operator could pull" in verdict.line
    )


def test_a_staged_release_of_0_0_0_is_read_from_update_engines_saved_answer(
    gpu_cluster: GateCluster,
) -> None:
    """update_engine restarted while an update waits reports NEED_REBOOT with 0.0.0
    (update_attempter.cc): no such release is ever looked up in the feed."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.publish(f"610.57.04-flatcar{B}")
    prefs = gpu_cluster.tmp / "prefs"
    gpu_cluster.feed_file.unlink()  # a release that cannot be real is never looked up in the feed
    verdict = gpu_cluster.judge(staged="0.0.0")
    assert not verdict.allowed
    assert verdict.line.startswith(
        "flatcar 0.0.0: update_engine reports no staged release (0.0.0: it was restarted since "
        f"it staged one), and its saved answer {prefs}/full-response cannot be read: "
    )
    prefs.mkdir()
    (prefs / "full-response").write_text(OMAHA_RESPONSE)
    (prefs / "previous-version").write_text(B)  # the release it runs: an earlier update's answer
    assert "names the release the node runs" in gpu_cluster.judge(staged="0.0.0").line
    (prefs / "previous-version").write_text("4593.2.4")  # written once the update is applied
    gpu_cluster.write_feed()
    assert gpu_cluster.judge(staged="0.0.0") == allowed(
        f"flatcar {B}: {gpu_cluster.repository}/driver:610.57.04-flatcar{B} published"
    )


def test_use_precompiled_holds_a_release_whose_kernel_another_release_already_runs(
    gpu_cluster: GateCluster,
) -> None:
    """The Operator maps each GPU node's kernel to its OS and refuses the whole ClusterPolicy
    when one kernel meets two releases (object_controls.go getKernelVersionsMap: "different OS
    versions found for the same kernel version"): every GPU node loses its driver reconcile,
    however many tags are published."""
    gpu_cluster.add_node("gpu-1")
    # gpu-2 on another release with B's kernel: one 6.12 kernel often ships in two channels
    release = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
    kernel = "feature.node.kubernetes.io/kernel-version.full"
    gpu_cluster.add_node("gpu-2", "4628.1.2", labels={release: "4628.1.2", kernel: KB})
    gpu_cluster.cluster_policy("610", precompiled=True)
    for version in (B, "4628.1.2"):
        gpu_cluster.publish(f"610-{KB}-flatcar{version}")
    assert gpu_cluster.judge() == held(
        f"flatcar {B}: its kernel {KB} is also gpu-2's, on flatcar 4628.1.2: with "
        'usePrecompiled the Operator then refuses ClusterPolicy cluster-policy ("different OS '
        'versions found for the same kernel version", object_controls.go) and reconciles no '
        "GPU node's driver; use the NVIDIADriver resource, a pool per release "
        "(docs/gpu-operator.md, mode 4)"
    )
