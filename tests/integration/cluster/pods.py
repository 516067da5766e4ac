"""What a kubelet gives a pod and writes about it, for peers run as processes here.

No kubelet runs in the cluster session. A peer that reads its in-cluster config
(client-go ``rest.InClusterConfig``: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the token and CA
at /var/run/secrets/kubernetes.io/serviceaccount) gets them as the kubelet would give them:
the ServiceAccount's bound token (TokenRequest) in a directory that a private mount namespace
mounts there. A pod object a peer must see (the gate's, which kured's blocking selector
matches) is created as its controller would, and its status written as the kubelet writes it
(``PATCH .../pods/<name>/status``).
"""

from __future__ import annotations

import subprocess
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apiserver import Cluster

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def service_account_dir(cluster: Cluster, directory: Path, namespace: str, account: str) -> Path:
    """token, ca.crt and namespace, as the kubelet projects them into a pod."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(cluster.token(namespace, account))
    (directory / "ca.crt").write_bytes(cluster.ca.read_bytes())
    (directory / "namespace").write_text(namespace)
    return directory


def in_cluster_env(cluster: Cluster) -> dict[str, str]:
    """What the kubelet sets for the ``kubernetes`` Service: here, the API server itself."""
    url = urllib.parse.urlsplit(cluster.url)
    return {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}


def start(argv: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A peer in a session of its own, its output appended to log."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)  # fmt: skip


def daemonset_pod(cluster: Cluster, daemonset: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The DaemonSet's pod on node, as its controller creates it (the template, the node's
    name, a controller reference), then Running and Ready, as the kubelet reports it."""
    metadata = daemonset["metadata"]
    template = daemonset["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{metadata['name']}-{node}",
            "namespace": metadata["namespace"],
            "labels": dict(template["metadata"]["labels"]),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": metadata["name"], "uid": metadata["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {**template["spec"], "nodeName": node},
    }  # fmt: skip
    created = cluster.apply(pod)
    now = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
    ready = [{"type": kind, "status": "True", "lastTransitionTime": now}
             for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]  # fmt: skip
    status = {"phase": "Running", "conditions": ready, "hostIP": "127.0.0.1", "startTime": now}
    path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{created['metadata']['name']}"
    return cluster.request("PATCH", f"{path}/status", {"status": status},
                           content_type="application/merge-patch+json")  # fmt: skip
