"""What the gate reads of the GPU Operator's modes: the rules alone, and the API server's
failures (injected). Its decisions on real clusters are in tests/integration/cluster/decisions."""

from __future__ import annotations

import base64
import json

import pytest
from conftest import STAGED, Cluster
from fake_apiserver import Fault

from nvidia_driver.gate.operator import DriverSpec, GPUNode, Kind, wanted_images
from nvidia_driver.gate.verdict import PULL_SECRET_KEYS

B, KB = STAGED, "6.12.102-flatcar"
# The paths the GPU Operator's CRDs add: each answers 404 while its CRD is not installed.
CRDS = {
    "clusterpolicies": "/apis/nvidia.com/v1/clusterpolicies",
    "nvidiadrivers": "/apis/nvidia.com/v1alpha1/nvidiadrivers",
    "gpuclusters": "/apis/nvidia.com/v1alpha1/gpuclusters",
}


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
        cluster.gpu_cluster()
    cluster.api.faults += [Fault("GET", CRDS[crd], 404, times=10) for crd in not_installed]
    if fault:
        cluster.api.faults.append(Fault("GET", fault, 500, times=10))
    verdict = cluster.judge()
    assert line in verdict.line
    assert verdict.allowed == (not fault and "nvidiadrivers" in not_installed
                               and "clusterpolicies" in not_installed)  # fmt: skip


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


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({"nvidia.com/gpu.deploy.driver": "pre-installed"}, True),  # k8s-driver-manager's
        ({"nvidia.com/gpu.deploy.driver": "false"}, True),
        ({"nvidia.com/gpu.deploy.driver": "true"}, False),
        ({}, False),  # not labelled yet: the Operator sets "true"
    ],
)
def test_an_nvidiadriver_node_the_operator_runs_no_driver_pod_on_reboots_freely(
    cluster: Cluster, labels: dict[str, str], allowed: bool
) -> None:
    """The driver DaemonSets select nvidia.com/gpu.deploy.driver=true (gpu-operator
    manifests/state-driver/0500_daemonset.yaml); a node with a host driver (pre-installed) or
    opted out pulls no driver image, and its NVIDIADriver pool changes no other node."""
    cluster.add_node("gpu-1", labels=labels)
    cluster.nvidia_driver("flatcar", "610.57.04")
    verdict = cluster.judge()
    assert verdict.allowed is allowed, verdict.line
    if allowed:
        assert "runs no driver pod on the node" in verdict.line


def _pull_secret(cluster: Cluster, kind: str, data: dict[str, bytes], *, private: bool) -> None:
    """Node gpu-1 on a ClusterPolicy whose pull secret ``pull`` (in the Operator's namespace)
    is of type kind and holds data; its tag published, to a registry that wants robot:s3cret
    when private (else anyone may pull)."""
    if private:
        cluster.registry.username, cluster.registry.password = "robot", "s3cret"
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04", secrets=("pull",))
    cluster.publish(f"610.57.04-flatcar{B}")
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    cluster.api.put("/api/v1/namespaces/gpu-operator/secrets/pull", {"type": kind, "data": encoded})


def _config(**entries: object) -> bytes:
    return json.dumps({"auths": entries}).encode()


def test_a_pull_secret_the_kubelet_cannot_read_holds_naming_it_not_its_contents(
    cluster: Cluster,
) -> None:
    """kubernetes v1.36 secrets.go MakeDockerKeyring fails on the secret, and image_manager.go
    fails the driver pod's every pull: the public image would be no help after the reboot."""
    good = base64.b64encode(b"robot:s3cret").decode()
    broken = _config(**{"ghcr.io": {"auth": "robot:s3cret"}, cluster.registry.host: {"auth": good}})
    _pull_secret(cluster, "kubernetes.io/dockerconfigjson", {".dockerconfigjson": broken},
                 private=False)  # fmt: skip
    verdict = cluster.judge()
    assert not verdict.allowed
    assert verdict.line.endswith(
        "pull secret gpu-operator/pull: an auth that is not base64: the kubelet refuses the whole "
        "secret and fails every pull of a pod that names it; correct the secret"
    )
    assert "s3cret" not in verdict.line
    assert "ghcr.io" not in verdict.line
    assert cluster.registry.log == []  # no other credentials, nor anonymous access, are tried


@pytest.mark.parametrize(
    ("kind", "key", "allowed"),
    [
        ("kubernetes.io/dockerconfigjson", ".dockerconfigjson", True),
        ("kubernetes.io/dockercfg", ".dockercfg", True),
        # The kubelet reads a secret by its type's key only: any other is no pull secret.
        ("Opaque", ".dockerconfigjson", False),
        ("kubernetes.io/dockercfg", ".dockerconfigjson", False),
        ("kubernetes.io/dockerconfigjson", ".dockercfg", False),
    ],
)
def test_a_pull_secret_gives_credentials_only_as_its_type_says(
    cluster: Cluster, kind: str, key: str, allowed: bool
) -> None:
    auth = {cluster.registry.host: {"auth": base64.b64encode(b"robot:s3cret").decode()}}
    config = json.dumps(auth if key == ".dockercfg" else {"auths": auth}).encode()
    # A secret of a docker type always holds its type's key, of JSON: the API server refuses one
    # without (kubernetes v1.36 pkg/apis/core/validation/validation.go, ValidateSecret); here
    # an empty one, the credentials beside it under the other type's key.
    own = PULL_SECRET_KEYS.get(kind)
    data = {key: config} if own in {None, key} else {own: b"{}", key: config}
    _pull_secret(cluster, kind, data, private=True)
    verdict = cluster.judge()
    assert verdict.allowed is allowed, verdict.line
    if not allowed:
        assert "the registry gives no anonymous token" in verdict.line


def test_a_secret_the_kubelet_takes_for_no_pull_secret_does_not_hold(cluster: Cluster) -> None:
    """An Opaque secret, or one without its type's key: the kubelet pulls without it."""
    _pull_secret(cluster, "Opaque", {"token": b"x"}, private=False)
    assert cluster.judge().allowed
