"""Which driver images the GPU Operator will ask for once a node runs a staged release.

Read from NVIDIA/gpu-operator (a22dbf6), and composed with the formulas of
:mod:`nvidia_driver.sources.gpuoperator`:

* ClusterPolicy (``nvidia.com/v1`` ``clusterpolicies``, ``spec.driver``): one DaemonSet, or one
  per kernel with ``usePrecompiled``; every one takes the OS tag of the *first* GPU node the
  Operator lists (``getGPUNodeOSInfo``: ``nvidia.com/gpu.present=true``, ``Limit(1)``), which
  may be any GPU node. So after node N moves to release B with kernel KB, the Operator may ask
  for B's tag on every GPU node, and for KB's tag with the OS tag of any GPU node's release.
* NVIDIADriver (``nvidia.com/v1alpha1`` ``nvidiadrivers``, ``driver.useNvidiaDriverCRD``): one
  DaemonSet per node pool, a pool per OS tag (and kernel, with ``usePrecompiled``) of the nodes
  the resource owns (``internal/state/nodepool.go``; the node label
  ``nvidia.com/gpu-operator.driver.owner`` names it). Node N then pulls B's own tag, nothing
  else changes. From v26.7 (GPUCluster mode) NVIDIADrivers drive the driver with no
  ClusterPolicy at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.kubeapi import KubeAPI, NotFoundError
from nvidia_driver.naming import DRIVER_BRANCH_RE, DRIVER_VERSION_RE
from nvidia_driver.safetext import shown
from nvidia_driver.sources.gpuoperator import (
    DIGEST_PREFIX,
    OS_ID,
    build_image_version,
    driver_tag,
    precompiled_tag,
)

CLUSTER_POLICIES = "/apis/nvidia.com/v1/clusterpolicies"
NVIDIA_DRIVERS = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
GPU_CLUSTERS = "/apis/nvidia.com/v1alpha1/gpuclusters"  # v26.7: NVIDIADrivers without a policy
NODES = "/api/v1/nodes"
# The labels the Operator reads (controllers/state_manager.go, internal/consts/consts.go).
GPU_PRESENT = "nvidia.com/gpu.present"
DRIVER_OWNER = "nvidia.com/gpu-operator.driver.owner"
# The driver DaemonSets select DEPLOY_DRIVER=true (manifests/state-driver/0500_daemonset.yaml):
# k8s-driver-manager sets "pre-installed" on a node with a host driver (disableContainerizedDriver),
# a user "false"; the Operator sets an absent or empty one "true" (state_manager.go).
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
NFD_OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
NFD_VERSION_ID = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
NFD_KERNEL = "feature.node.kubernetes.io/kernel-version.full"
ARCH = "kubernetes.io/arch"
_BUILD_SUFFIX = build_image_version("")  # "-flatcar": the build image's tag ends so
# 610.57.04, or the branch 610
_DRIVER_AT_END = re.compile(rf"(?:{DRIVER_VERSION_RE.pattern}|{DRIVER_BRANCH_RE.pattern})$")


class Kind(StrEnum):
    """What the cluster's driver image is, as its version says."""

    PRECOMPILED = "precompiled"  # <driver>: a precompiled image per release
    BRANCH = "usePrecompiled"  # <branch>: the Operator's per-kernel tags
    BUILD = "build"  # <driver>-flatcar: the build image, through its per-release alias
    DIGEST = "digest"  # sha256:...: one image for every release, nothing appended


@dataclass(frozen=True)
class DriverSpec:
    """The fields of a ClusterPolicy's spec.driver or an NVIDIADriver's spec the image is
    composed of."""

    source: str  # "ClusterPolicy cluster-policy"
    repository: str
    image: str
    version: str
    use_precompiled: bool
    pull_secrets: tuple[str, ...]
    per_pool: bool  # NVIDIADriver: every release's nodes get a DaemonSet of their own

    @property
    def path(self) -> str:
        """The Operator's imagePath, before any suffix; ``<image>`` alone when repository and
        version are empty (kbld)."""
        if not self.repository and not self.version and self.image:
            return self.image
        if not (self.repository and self.image and self.version):
            raise DriverError(
                f"{self.source}: repository, image and version must all be set, as the "
                f"Operator requires (repository={self.repository!r}, image={self.image!r}, "
                f"version={self.version!r})"
            )
        separator = "@" if self.version.startswith(DIGEST_PREFIX) else ":"
        return f"{self.repository}/{self.image}{separator}{self.version}"

    @property
    def tag(self) -> str:
        """The tag the path ends in ("" for a digest)."""
        last = self.path.rpartition("/")[2]
        return "" if DIGEST_PREFIX in last or ":" not in last else last.rpartition(":")[2]

    @property
    def kind(self) -> Kind:
        if not self.tag:
            return Kind.DIGEST
        if self.use_precompiled:
            return Kind.BRANCH
        return Kind.BUILD if self.tag.endswith(_BUILD_SUFFIX) else Kind.PRECOMPILED

    @property
    def driver(self) -> str:
        """The driver version (or branch) the tag ends in, after any prefix; "" for none."""
        match = _DRIVER_AT_END.search(self.tag.removesuffix(_BUILD_SUFFIX))
        return match.group(0) if match else ""


@dataclass(frozen=True)
class GPUNode:
    """What the Operator reads of a GPU node: its release, kernel and arch."""

    name: str
    version_id: str
    kernel: str
    arch: str

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> GPUNode | None:
        """None for a node without NFD's Flatcar labels (the Operator skips or refuses it)."""
        labels = metadata(node, "labels")
        version, kernel = labels.get(NFD_VERSION_ID, ""), labels.get(NFD_KERNEL, "")
        if labels.get(NFD_OS_ID) != OS_ID or not version or not kernel:
            return None
        return cls(str(node.get("metadata", {}).get("name", "")), version, kernel, node_arch(node))


@dataclass(frozen=True)
class Wanted:
    """One image the Operator may ask for after the reboot, and the arches that will pull it."""

    reference: str
    arches: frozenset[str]


def metadata(resource: Mapping[str, Any], key: str) -> Mapping[str, str]:
    """A resource's ``labels`` or ``annotations``; {} when it has none."""
    found = resource.get("metadata", {}).get(key)
    return found if isinstance(found, Mapping) else {}


def node_arch(node: Mapping[str, Any]) -> str:
    """The node's arch label, else the kubelet's ``nodeInfo``."""
    info = node.get("status", {}).get("nodeInfo", {})
    return str(metadata(node, "labels").get(ARCH) or info.get("architecture", ""))


def _bool(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _secrets(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    names = [item if isinstance(item, str) else item.get("name", "") for item in value
             if isinstance(item, str | Mapping)]  # fmt: skip
    return tuple(str(name) for name in names if name)


# --- which resource says how this node's driver is installed ---------------------------------


def driver_spec(api: KubeAPI, node: Mapping[str, Any]) -> DriverSpec | str:
    """The spec the node's driver image comes from, or why the Operator installs none there.

    As the v26.7 Operator picks its active config (``controllers/active_config.go``
    ``resolveActiveConfig``): the singleton ClusterPolicy and the GPUCluster. NVIDIADrivers
    drive the driver when no ClusterPolicy exists, or when it sets ``useNvidiaDriverCRD``
    (``controllers/nvidiadriver_controller.go``). A CRD's 404 means it is not installed; any
    other failure to read raises, and the reboot is held.
    """
    policies = _installed(api, CLUSTER_POLICIES)
    gpu_clusters = _installed(api, GPU_CLUSTERS)
    policy = _singleton(policies or [])
    if policy is None:
        return _without_cluster_policy(api, node, policies is not None, gpu_clusters or [])
    name = _name(policy)
    driver = policy.get("spec", {}).get("driver", {})
    if not isinstance(driver, Mapping):
        driver = {}
    if _bool(driver.get("useNvidiaDriverCRD")):
        return _nvidia_driver_spec(node, api.list(NVIDIA_DRIVERS))
    if gpu_clusters:
        # controllers/clusterpolicy_controller.go: "ClusterPolicy and GPUCluster cannot co-exist".
        raise DriverError(
            f"ClusterPolicy {name} and GPUCluster {_name(gpu_clusters[0])} both exist: the "
            "Operator reconciles neither its ClusterPolicy nor the driver; delete one of them"
        )
    if driver.get("enabled") is False or driver.get("enabled") == "false":
        return f"ClusterPolicy {name} has driver.enabled=false: the Operator installs no driver"
    return _spec(f"ClusterPolicy {name}", driver, per_pool=False)


def _without_cluster_policy(
    api: KubeAPI,
    node: Mapping[str, Any],
    policy_crd: bool,
    gpu_clusters: list[dict[str, Any]],
) -> DriverSpec | str:
    """v26.7 (GPUCluster mode, or no config at all): the NVIDIADrivers drive the driver."""
    drivers = _installed(api, NVIDIA_DRIVERS)
    if drivers is None and gpu_clusters:
        raise DriverError(
            f"GPUCluster {_name(gpu_clusters[0])} exists but the API server serves no "
            "NVIDIADriver (its CRD is not installed): install the Operator's CRDs"
        )
    if drivers is None and not policy_crd:
        return "the GPU Operator is not installed (no ClusterPolicy or NVIDIADriver CRD)"
    if not drivers:
        return "no ClusterPolicy and no NVIDIADriver: the GPU Operator installs no driver"
    return _nvidia_driver_spec(node, drivers)


def _installed(api: KubeAPI, path: str) -> list[dict[str, Any]] | None:
    """The items of a custom resource's list; None when its CRD is not installed (404)."""
    try:
        return api.list(path)
    except NotFoundError:
        return None


def _singleton(policies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """getSingletonClusterPolicy (controllers/active_config.go): the oldest, then the lowest
    name; the Operator marks any other "ignored"."""
    return min(
        policies,
        key=lambda p: (str(p.get("metadata", {}).get("creationTimestamp", "")), _name(p)),
        default=None,
    )


def _name(resource: Mapping[str, Any]) -> str:
    return shown(str(resource.get("metadata", {}).get("name", "?")), 100)


def _spec(source: str, fields: Mapping[str, Any], *, per_pool: bool) -> DriverSpec:
    """spec.driver of a ClusterPolicy and spec of an NVIDIADriver share these field names."""
    return DriverSpec(
        source=source,
        repository=str(fields.get("repository", "")),
        image=str(fields.get("image", "")),
        version=str(fields.get("version", "")),
        use_precompiled=_bool(fields.get("usePrecompiled")),
        pull_secrets=_secrets(fields.get("imagePullSecrets")),
        per_pool=per_pool,
    )


def _nvidia_driver_spec(node: Mapping[str, Any], drivers: list[dict[str, Any]]) -> DriverSpec | str:
    labels = metadata(node, "labels")
    deploy = labels.get(DEPLOY_DRIVER, "")
    if deploy not in {"", "true"}:  # no driver pod here, and its pool moves no other node
        return f"{DEPLOY_DRIVER}={shown(deploy, 40)}: the Operator runs no driver pod on the node"
    owner = labels.get(DRIVER_OWNER, "")
    if owner:
        resources = [r for r in drivers if r.get("metadata", {}).get("name") == owner]
        if not resources:
            return (
                f"the node's {DRIVER_OWNER} label names NVIDIADriver {shown(owner, 100)}, "
                "which does not exist: the Operator installs no driver here"
            )
    else:  # Operators before the owner label: the resources whose nodeSelector takes the node
        resources = [
            resource
            for resource in drivers
            if all(labels.get(k) == v for k, v in _node_selector(resource).items())
        ]
    if not resources:
        return "no NVIDIADriver selects this node: the GPU Operator installs no driver here"
    if len(resources) > 1:
        names = ", ".join(_name(resource) for resource in resources)
        raise DriverError(f"NVIDIADrivers {names} all select this node: the Operator refuses that")
    resource = resources[0]
    spec = resource.get("spec", {})
    name = _name(resource)
    if spec.get("driverType", "gpu") != "gpu":
        return (
            f"NVIDIADriver {name} is driverType {shown(str(spec.get('driverType')), 40)}, not gpu"
        )
    return _spec(f"NVIDIADriver {name}", spec, per_pool=True)


def _node_selector(resource: Mapping[str, Any]) -> Mapping[str, str]:
    """GetNodeSelector: the spec's, else every GPU node."""
    selector = resource.get("spec", {}).get("nodeSelector")
    return selector if isinstance(selector, Mapping) and selector else {GPU_PRESENT: "true"}


# --- which images the Operator may ask for after the reboot ----------------------------------


def gpu_nodes(api: KubeAPI) -> list[GPUNode]:
    """Every GPU node with NFD's Flatcar labels, as the ClusterPolicy's DaemonSets see them."""
    found = (GPUNode.of(node) for node in api.list(NODES, f"{GPU_PRESENT}=true"))
    return [node for node in found if node is not None]


def shared_kernel(spec: DriverSpec, after: GPUNode, others: Iterable[GPUNode]) -> str:
    """Why the Operator would refuse the ClusterPolicy once ``after`` runs its release, or "".

    With usePrecompiled it maps every GPU node's kernel to its OS, and one kernel on two
    releases fails its whole reconcile: v26.7.0 ``controllers/object_controls.go``
    ``getKernelVersionsMap`` returns "different OS versions found for the same kernel version",
    and ``state_manager.go`` ``init`` returns that error, so no GPU node's driver DaemonSet is
    reconciled. NVIDIADriver pools (``nodepool.go``) split by release and kernel instead.
    """
    if spec.per_pool or not spec.use_precompiled:
        return ""
    sharing = sorted(
        (node.name, node.version_id)
        for node in others
        if node.name != after.name
        and node.kernel == after.kernel
        and node.version_id != after.version_id
    )
    if not sharing:
        return ""
    name, version = sharing[0]
    more = f" (and {len(sharing) - 1} more GPU nodes)" if len(sharing) > 1 else ""
    return (
        f"its kernel {shown(after.kernel, 60)} is also {shown(name, 60)}'s, on flatcar "
        f"{shown(version, 40)}{more}: with usePrecompiled the Operator then refuses {spec.source} "
        '("different OS versions found for the same kernel version", object_controls.go) and '
        "reconciles no GPU node's driver; use the NVIDIADriver resource, a pool per release "
        "(docs/gpu-operator.md, mode 4)"
    )


def wanted_images(spec: DriverSpec, after: GPUNode, others: Iterable[GPUNode]) -> list[Wanted]:
    """The images node ``after`` (already on its staged release) makes the Operator ask for
    that it may not have asked for before: B's tags, and with ``usePrecompiled`` KB's."""
    path = spec.path
    if spec.kind is Kind.DIGEST:
        if spec.use_precompiled:
            raise DriverError(
                f"{spec.source}: usePrecompiled with a digest version: the Operator rejects it"
            )
        return []  # one image for every release
    if spec.per_pool:
        if spec.use_precompiled:
            reference = precompiled_tag(path, after.kernel, after.version_id)
        else:
            reference = driver_tag(path, after.version_id)
        return [Wanted(reference, frozenset({after.arch}))]
    cluster = [node for node in others if node.name != after.name] + [after]
    if not spec.use_precompiled:
        # The one DaemonSet takes B's tag once any node on B is listed first: every GPU node
        # pulls it then.
        arches = frozenset(node.arch for node in cluster)
        return [Wanted(driver_tag(path, after.version_id), arches)]
    versions = sorted({node.version_id for node in cluster})
    pulling = {
        k: frozenset(n.arch for n in cluster if n.kernel == k) for k in {n.kernel for n in cluster}
    }  # kernel -> the arches of its nodes, which its DaemonSet runs on
    return [
        Wanted(precompiled_tag(path, kernel, version), pulling[kernel])
        for kernel in sorted(pulling)
        for version in versions
        if kernel == after.kernel or version == after.version_id
    ]
