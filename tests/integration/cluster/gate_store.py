"""The gate's cluster (tests/shared/gate_cluster.py) on the session's real kube-apiserver.

A test writes its objects as the admin; the gate reads and writes them with deploy/reboot-gate's
ServiceAccount token, so the real server's validation, RBAC and admission (the namespace's
restricted Pod Security) apply to every request it makes. What a kubelet would write (a node's
``status.nodeInfo``, a pod's container states) the test writes through the ``status``
subresource, as the kubelet does. Every object a test made is deleted after it: the scenarios
share one API server.
"""

from __future__ import annotations

import copy
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

from apiserver import APIError, Cluster
from gate import ACCOUNT, install
from gate_cluster import CLUSTER_POLICY, NAMESPACE, GateCluster
from gpu_operator import install_operator, sample
from oci_registry import OCIRegistry

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"  # the gate's pre-pull pods
# What each collection holds: a test's documents name only their path, as it writes them.
KINDS = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "secrets": ("v1", "Secret"),
    "clusterpolicies": ("nvidia.com/v1", "ClusterPolicy"),
    "nvidiadrivers": ("nvidia.com/v1alpha1", "NVIDIADriver"),
    "gpuclusters": ("nvidia.com/v1alpha1", "GPUCluster"),
}
# v26.7.0's GPUCluster (deployments/gpu-operator/crds/nvidia.com_gpuclusters.yaml at the tag):
# its group, names, version and scope. The Go module proxy does not serve v26.7.0
# (tests/integration/cluster/peers.toml [unserved.gpu-operator]), so its schema is not here:
# the gate reads only that one exists, and its name.
GPU_CLUSTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpuclusters.nvidia.com"},
    "spec": {
        "group": "nvidia.com",
        "names": {
            "kind": "GPUCluster",
            "listKind": "GPUClusterList",
            "plural": "gpuclusters",
            "singular": "gpucluster",
            "shortNames": ["gc"],
        },
        "scope": "Cluster",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


class RealStore:
    """The Store of gate_cluster.py on the real API server, remembering what it made."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.made: list[str] = []
        self.since = cluster.audit_size()  # the test's requests are what comes after

    @property
    def url(self) -> str:
        return self.cluster.url

    def put(self, path: str, document: dict[str, Any]) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        api_version, kind = KINDS[parts[-2]]
        written = copy.deepcopy(document)
        written.update(apiVersion=api_version, kind=kind)
        metadata = written.setdefault("metadata", {})
        metadata["name"] = parts[-1]
        if "namespaces" in parts:
            metadata["namespace"] = parts[parts.index("namespaces") + 1]
        status = written.pop("status", None)
        stored = self.cluster.apply(written)
        if path not in self.made:
            self.made.append(path)
        if status is not None:
            stored = self._write_status(path, stored, status)
        return stored

    def get(self, path: str) -> dict[str, Any]:
        return self.cluster.get(path)

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change the object as another client would: its spec and metadata, then its status."""
        before = self.get(path)
        after = copy.deepcopy(before)
        change(after)
        stored = before
        if {**after, "status": None} != {**before, "status": None}:
            stored = self.cluster.request("PUT", path, {**after, "status": before.get("status")})
        if after.get("status") != before.get("status"):
            stored = self._write_status(path, stored, after.get("status"))
        return stored

    def items(self, path: str) -> list[dict[str, Any]]:
        """The objects at path, without those being deleted: a pod on a node stays, Terminating,
        until its kubelet confirms, and none runs here."""
        every = self.cluster.items(path)
        return [item for item in every if "deletionTimestamp" not in item["metadata"]]

    def _write_status(self, path: str, stored: dict[str, Any], status: Any) -> dict[str, Any]:
        return self.cluster.request("PUT", f"{path}/status", {**stored, "status": status})

    def delete_made(self) -> None:
        """Delete what the test made, and the pods and events the gate made."""
        for path in reversed(self.made):
            self.cluster.delete(path)
        for pod in self.cluster.items(PODS):
            # At once: no kubelet runs here to confirm a graceful deletion.
            self.cluster.delete(f"{PODS}/{pod['metadata']['name']}?gracePeriodSeconds=0")
        self.cluster.request("DELETE", "/api/v1/namespaces/default/events")


def gate_requests(gpu_cluster: GateCluster) -> list[tuple[str, str]]:
    """(verb, path) of each request the gate's ServiceAccount made, from the audit log."""
    store = gpu_cluster.api
    assert isinstance(store, RealStore)
    user = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    return [(verb, uri.split("?")[0]) for verb, uri in store.cluster.requests_of(user, store.since)]


def prepare(cluster: Cluster, operator_module: Path) -> None:
    """The gate's manifests (the FLUO variant, and the optional pull-secrets Role), the
    Operator's CRDs (v25.3.4's: no GPUCluster, whose path answers the gate 404) and namespace."""
    install_operator(cluster, operator_module)
    install(cluster, "fluo")
    install(cluster, "pull-secrets")
    for policy in cluster.items("/apis/nvidia.com/v1/clusterpolicies"):
        cluster.delete(f"{CLUSTER_POLICY.rsplit('/', 1)[0]}/{policy['metadata']['name']}")


@contextmanager
def gpu_cluster_crd(cluster: Cluster) -> Iterator[None]:
    """v26.7's GPUCluster CRD, installed while the context lasts; gone (not only deleting)
    afterwards, so that the next test's gate meets its 404 again."""
    name = "gpuclusters.nvidia.com"
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    cluster.apply(GPU_CLUSTER_CRD)
    cluster.wait_established(name)
    try:
        yield
    finally:
        cluster.delete(path)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _exists(cluster, path):
            time.sleep(0.2)


def _exists(cluster: Cluster, path: str) -> bool:
    try:
        cluster.get(path)
    except APIError as error:
        if error.status == HTTPStatus.NOT_FOUND:
            return False
        raise
    return True


@contextmanager
def gate_cluster(cluster: Cluster, operator_module: Path, tmp: Path) -> Iterator[GateCluster]:
    """A GateCluster on the real API server, whose gate speaks with the ServiceAccount's token;
    everything the test made is deleted afterwards, also on failure."""
    store = RealStore(cluster)
    policy = sample(operator_module, "v1_clusterpolicy.yaml")
    try:
        with OCIRegistry() as registry:
            yield GateCluster(
                store,
                registry,
                tmp,
                cluster.token(NAMESPACE, ACCOUNT),
                ssl.create_default_context(cafile=str(cluster.ca)),
                policy_spec=policy["spec"],
            )
    finally:
        store.delete_made()
