"""What the gate checks in each GPU Operator mode, against the registry and Flatcar's feed."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from conftest import STAGED, Cluster
from fake_apiserver import Fault

from nvidia_driver.gate.operator import DriverSpec, GPUNode, Kind, wanted_images
from nvidia_driver.gate.verdict import Verdict, allowed, held

B, KB = STAGED, "6.12.102-flatcar"
# The paths the GPU Operator's CRDs add: each answers 404 while its CRD is not installed.
CRDS = {
    "clusterpolicies": "/apis/nvidia.com/v1/clusterpolicies",
    "nvidiadrivers": "/apis/nvidia.com/v1alpha1/nvidiadrivers",
    "gpuclusters": "/apis/nvidia.com/v1alpha1/gpuclusters",
}


def _judge(cluster: Cluster, name: str = "gpu-1", staged: str = STAGED) -> Verdict:
    return cluster.checker(cluster.api_client()).verdict(cluster.node(name), staged)


def _nvidia_driver(cluster: Cluster, name: str, version: str, **spec: Any) -> None:
    cluster.api.put(
        f"/apis/nvidia.com/v1alpha1/nvidiadrivers/{name}",
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "spec": {
                "driverType": "gpu",
                "repository": cluster.repository,
                "image": "driver",
                "version": version,
                **spec,
            },
        },
    )


def test_clusterpolicy_default_mode_wants_the_staged_release_tag_on_every_arch(
    cluster: Cluster,
) -> None:
    """One DaemonSet for every GPU node: once a node on B is listed first, all pull B's tag."""
    cluster.add_node("gpu-1")
    cluster.add_node("gpu-2", arch="arm64")
    cluster.cluster_policy("610.57.04")
    cluster.publish(f"610.57.04-flatcar{B}", ("amd64",))
    assert _judge(cluster) == held(
        f"flatcar {B}: {cluster.repository}/driver:610.57.04-flatcar{B} has no linux/arm64 image"
    )
    cluster.publish(f"610.57.04-flatcar{B}", ("amd64", "arm64"))
    assert _judge(cluster) == allowed(
        f"flatcar {B}: {cluster.repository}/driver:610.57.04-flatcar{B} published"
    )


def test_clusterpolicy_use_precompiled_wants_every_tag_the_first_node_rule_can_ask_for() -> None:
    """Per-kernel DaemonSets, each with the first GPU node's OS tag: B's kernel with every
    release's tag, and every kernel with B's tag."""
    spec = DriverSpec(
        "ClusterPolicy p",
        "r.example/o",
        "driver",
        "610",
        use_precompiled=True,
        pull_secrets=(),
        per_pool=False,
    )
    after = GPUNode("gpu-1", B, KB, "amd64")
    others = [
        GPUNode("gpu-1", "4593.2.4", "6.12.95-flatcar", "amd64"),
        GPUNode("gpu-2", "4593.2.4", "6.12.95-flatcar", "amd64"),
        GPUNode("gpu-3", "4628.1.1", "6.12.87-flatcar", "arm64"),
    ]
    wanted = {w.reference: sorted(w.arches) for w in wanted_images(spec, after, others)}
    assert wanted == {
        f"r.example/o/driver:610-{KB}-flatcar4593.2.4": ["amd64"],
        f"r.example/o/driver:610-{KB}-flatcar{B}": ["amd64"],
        f"r.example/o/driver:610-{KB}-flatcar4628.1.1": ["amd64"],
        f"r.example/o/driver:610-6.12.87-flatcar-flatcar{B}": ["arm64"],
        f"r.example/o/driver:610-6.12.95-flatcar-flatcar{B}": ["amd64"],
    }


def test_nvidiadriver_pools_want_only_the_nodes_own_release(cluster: Cluster) -> None:
    """One DaemonSet per release (and kernel): the node joins B's pool, nothing else moves."""
    owner = {"nvidia.com/gpu-operator.driver.owner": "flatcar"}
    cluster.add_node("gpu-1", labels=owner)
    cluster.add_node("gpu-2", arch="arm64", labels=owner)
    cluster.cluster_policy("unused", crd=True)
    _nvidia_driver(cluster, "flatcar", "610", usePrecompiled=True)
    cluster.publish(f"610-{KB}-flatcar{B}")
    assert _judge(cluster) == allowed(
        f"flatcar {B}: {cluster.repository}/driver:610-{KB}-flatcar{B} published"
    )
    assert not any(path.endswith("/api/v1/nodes") for _, path, _ in cluster.api.log)


def test_an_nvidiadriver_is_found_by_its_node_selector_without_the_owner_label(
    cluster: Cluster,
) -> None:
    cluster.add_node("gpu-1")
    cluster.cluster_policy("unused", crd=True)
    _nvidia_driver(
        cluster,
        "flatcar",
        "610.57.04",
        nodeSelector={"feature.node.kubernetes.io/system-os_release.ID": "flatcar"},
    )
    _nvidia_driver(
        cluster,
        "ubuntu",
        "610.57.04",
        nodeSelector={"feature.node.kubernetes.io/system-os_release.ID": "ubuntu"},
    )
    assert _judge(cluster) == held(
        f"flatcar {B}: {cluster.repository}/driver:610.57.04-flatcar{B} not published yet"
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
    cluster: Cluster, policy: dict[str, Any] | None, line: str
) -> None:
    cluster.add_node("gpu-1")
    if policy is not None:
        cluster.api.put(
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy", {"spec": {"driver": policy}}
        )
    assert _judge(cluster) == allowed(f"flatcar {B}: {line}")


def _gpu_cluster(cluster: Cluster) -> None:
    """v26.7's GPUCluster: its CRD pins the one name (controllers/active_config.go)."""
    cluster.api.put(
        "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster",
        {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "spec": {"draDriver": {}}},
    )


@pytest.mark.parametrize("gpu_cluster", [True, False])
def test_nvidiadrivers_without_a_clusterpolicy_are_checked(
    cluster: Cluster, gpu_cluster: bool
) -> None:
    """v26.7 reconciles NVIDIADrivers when no ClusterPolicy exists (GPUCluster mode,
    controllers/nvidiadriver_controller.go): 'no ClusterPolicy' is no longer 'no driver'."""
    cluster.add_node("gpu-1", labels={"nvidia.com/gpu-operator.driver.owner": "flatcar"})
    if gpu_cluster:
        _gpu_cluster(cluster)
    _nvidia_driver(cluster, "flatcar", "610.57.04")
    assert _judge(cluster) == held(
        f"flatcar {B}: {cluster.repository}/driver:610.57.04-flatcar{B} not published yet"
    )
    cluster.publish(f"610.57.04-flatcar{B}")
    assert _judge(cluster).allowed


def test_a_clusterpolicy_beside_a_gpucluster_holds(cluster: Cluster) -> None:
    """The ClusterPolicy controller refuses to reconcile while a GPUCluster exists."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish(f"610.57.04-flatcar{B}")
    _gpu_cluster(cluster)
    verdict = _judge(cluster)
    assert not verdict.allowed
    assert "ClusterPolicy cluster-policy and GPUCluster gpu-cluster both exist" in verdict.line


@pytest.mark.parametrize(
    ("not_installed", "fault", "line"),
    [
        (
            {"clusterpolicies", "nvidiadrivers", "gpuclusters"},
            "",
            "the GPU Operator is not installed (no ClusterPolicy or NVIDIADriver CRD)",
        ),
        ({"nvidiadrivers"}, "", "GPUCluster gpu-cluster exists"),
        (set(), "/apis/nvidia.com/v1alpha1/gpuclusters", "gpuclusters answered 500"),
        (set(), "/apis/nvidia.com/v1alpha1/nvidiadrivers", "nvidiadrivers answered 500"),
        (set(), "/apis/nvidia.com/v1/clusterpolicies", "clusterpolicies answered 500"),
    ],
)
def test_what_the_gate_cannot_read_of_the_operators_config_holds(
    cluster: Cluster, not_installed: set[str], fault: str, line: str
) -> None:
    """A CRD's 404 means 'not installed'; the Operator is absent only when neither the
    ClusterPolicy nor the NVIDIADriver path exists. Any other failure holds."""
    cluster.add_node("gpu-1")
    if "gpuclusters" not in not_installed:
        _gpu_cluster(cluster)
    cluster.api.faults += [Fault("GET", CRDS[crd], 404, times=10) for crd in not_installed]
    if fault:
        cluster.api.faults.append(Fault("GET", fault, 500, times=10))
    verdict = _judge(cluster)
    assert line in verdict.line
    assert verdict.allowed == (not fault and "nvidiadrivers" in not_installed
                               and "clusterpolicies" in not_installed)  # fmt: skip


def test_a_digest_asks_for_no_tag_and_the_build_is_checked(cluster: Cluster) -> None:
    """driver.version=sha256:...: the Operator appends nothing; a kernel the driver's sources
    do not build on holds (the gate's own image, 560 here, has no patch for 6.12.97+)."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("sha256:" + "ab" * 32)
    api = cluster.api_client()
    checker = cluster.checker(api)
    checker.build.driver_version = "560.35.03"
    verdict = checker.verdict(cluster.node("gpu-1"), B)
    assert not verdict.allowed
    assert verdict.line.startswith(
        f"flatcar {B}: driver 560.35.03 kernel-open does not build "
        f"on kernel {KB}: it needs patch pci-resize-resource"
    )


def test_a_feed_without_the_staged_release_holds_until_it_lists_it(cluster: Cluster) -> None:
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish(f"610.57.04-flatcar{B}")
    listed = cluster.feed.pop(B)
    cluster.write_feed()
    assert _judge(cluster) == held(
        f"flatcar {B}: not in Flatcar's releases feed "
        f"({cluster.feed_file.as_uri()}) yet, so its kernel is "
        "unknown"
    )
    cluster.feed[B] = listed
    cluster.write_feed()
    assert _judge(cluster).allowed


def test_the_operators_pull_secret_opens_a_private_registry(cluster: Cluster) -> None:
    cluster.registry.username, cluster.registry.password = "robot", "s3cret"
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04", secrets=("driver-pull-secret",))
    cluster.publish(f"610.57.04-flatcar{B}")
    # The secret lives in the Operator's namespace (deploy/reboot-gate/pull-secrets lets the
    # gate read it).
    auth = base64.b64encode(b"robot:s3cret").decode()
    config = json.dumps({"auths": {cluster.registry.host: {"auth": auth}}}).encode()
    cluster.api.put(
        "/api/v1/namespaces/gpu-operator/secrets/driver-pull-secret",
        {
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()},
        },
    )
    assert _judge(cluster).allowed
    assert cluster.registry.tokens_issued == ["repository:o/driver:pull"]


def test_a_pull_secret_name_that_is_no_kubernetes_name_holds_without_a_request(
    cluster: Cluster,
) -> None:
    """The name is a segment of the request's path: '..' would make it another request."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04", secrets=("../../../nodes/gpu-1",))
    cluster.publish(f"610.57.04-flatcar{B}")
    verdict = _judge(cluster)
    assert not verdict.allowed
    assert verdict.line.endswith(
        "pull secret '../../../nodes/gpu-1', which is not a Kubernetes object name (lower-case "
        "letters, digits, '-' and '.', at most 253): correct imagePullSecrets in ClusterPolicy "
        "cluster-policy"
    )
    assert not [path for _, path, _ in cluster.api.log if "/secrets/" in path or ".." in path]


def test_a_registry_that_wants_credentials_the_gate_lacks_holds(cluster: Cluster) -> None:
    cluster.registry.username, cluster.registry.password = "robot", "s3cret"
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    assert _judge(cluster) == held(
        f"flatcar {B}: cannot check its driver image: "
        f"{cluster.repository}/driver:610.57.04-flatcar{B}: the registry gives no "
        "anonymous token, 401 (DENIED): set the GPU Operator's "
        "driver.imagePullSecrets and let the gate read them (docs/gpu-operator.md, "
        "the reboot gate's RBAC)"
    )


def test_a_broken_registry_holds(cluster: Cluster) -> None:
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.registry.status = 503
    verdict = _judge(cluster)
    assert not verdict.allowed
    assert verdict.line.endswith(
        f"/o/driver:610.57.04-flatcar{B}: the registry answered 503"  # to a HEAD: no body
    )


@pytest.mark.parametrize(
    ("version", "precompiled", "kind", "driver"),
    [
        ("610.57.04", False, Kind.PRECOMPILED, "610.57.04"),
        ("610.57.04-flatcar", False, Kind.BUILD, "610.57.04"),
        ("flatcar-test-5b98d7b9-610.57.04-flatcar", False, Kind.BUILD, "610.57.04"),
        ("610", True, Kind.BRANCH, "610"),
        ("sha256:" + "ab" * 32, False, Kind.DIGEST, ""),
    ],
)
def test_the_version_says_which_image_the_cluster_runs(
    version: str, precompiled: bool, kind: Kind, driver: str
) -> None:
    spec = DriverSpec("p", "ghcr.io/o", "driver", version, precompiled, (), per_pool=False)
    assert (spec.kind, spec.driver) == (kind, driver)


def test_a_policy_that_names_no_pullable_image_holds_in_one_line(cluster: Cluster) -> None:
    """Text from the cluster never reaches the node's annotation or event with a line break."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04\nRebootAllowed")
    verdict = _judge(cluster)
    assert not verdict.allowed
    assert "\n" not in verdict.line
    assert (
        "/driver:610.57.04\\nRebootAllowed-flatcar4593.2.5' is not an image reference the "
        "Operator could pull" in verdict.line
    )


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


def test_a_staged_release_of_0_0_0_is_read_from_update_engines_saved_answer(
    cluster: Cluster,
) -> None:
    """update_engine restarted while an update waits reports NEED_REBOOT with 0.0.0
    (update_attempter.cc): no such release is ever looked up in the feed."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish(f"610.57.04-flatcar{B}")
    prefs = cluster.tmp / "prefs"
    cluster.feed_file.unlink()  # a release that cannot be real is never looked up in the feed
    verdict = _judge(cluster, staged="0.0.0")
    assert not verdict.allowed
    assert verdict.line.startswith(
        "flatcar 0.0.0: update_engine reports no staged release (0.0.0: it was restarted since "
        f"it staged one), and its saved answer {prefs}/full-response cannot be read: "
    )
    prefs.mkdir()
    (prefs / "full-response").write_text(OMAHA_RESPONSE)
    (prefs / "previous-version").write_text("4593.2.4")  # written after: an older answer
    assert "is older than the update" in _judge(cluster, staged="0.0.0").line
    os.utime(prefs / "previous-version", (0, 0))
    cluster.write_feed()
    assert _judge(cluster, staged="0.0.0") == allowed(
        f"flatcar {B}: {cluster.repository}/driver:610.57.04-flatcar{B} published"
    )


def test_use_precompiled_holds_a_release_whose_kernel_another_release_already_runs(
    cluster: Cluster,
) -> None:
    """The Operator maps each GPU node's kernel to its OS and refuses the whole ClusterPolicy
    when one kernel meets two releases (object_controls.go getKernelVersionsMap: "different OS
    versions found for the same kernel version"): every GPU node loses its driver reconcile,
    however many tags are published."""
    cluster.add_node("gpu-1")
    # gpu-2 on another release with B's kernel: one 6.12 kernel often ships in two channels
    release = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
    kernel = "feature.node.kubernetes.io/kernel-version.full"
    cluster.add_node("gpu-2", "4628.1.2", labels={release: "4628.1.2", kernel: KB})
    cluster.cluster_policy("610", precompiled=True)
    for version in (B, "4628.1.2"):
        cluster.publish(f"610-{KB}-flatcar{version}")
    assert _judge(cluster) == held(
        f"flatcar {B}: its kernel {KB} is also gpu-2's, on flatcar 4628.1.2: with "
        'usePrecompiled the Operator then refuses ClusterPolicy cluster-policy ("different OS '
        'versions found for the same kernel version", object_controls.go) and reconciles no '
        "GPU node's driver; use the NVIDIADriver resource, a pool per release "
        "(docs/gpu-operator.md, mode 4)"
    )
