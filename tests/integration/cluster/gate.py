"""The reboot gate as its DaemonSet runs it: ``nvidia-driver reboot-gate``, with the token the
API server issues to deploy/reboot-gate's ServiceAccount, so it can do exactly what the
manifests' roles grant.

A pod's token and CA are at /var/run/secrets/kubernetes.io/serviceaccount (the gate reads them
there, as every in-cluster client does): the gate runs in a private mount namespace
(``unshare -m``) where a directory of ours is mounted there, so the host is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from apiserver import Cluster
from gate_cluster import NAMESPACE
from gate_manifests import DEPLOY as MANIFESTS
from gate_manifests import manifests

ACCOUNT = "nvidia-reboot-gate"  # 0100_service_account.yaml
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def install(cluster: Cluster, variant: str) -> None:
    """What ``kubectl apply -k deploy/reboot-gate/<variant>`` installs (common's namespace,
    account and roles, the variant's), file by file as its kustomization.yaml lists them; the
    DaemonSet too (no kubelet runs it here)."""
    cluster.apply_files(manifests(MANIFESTS / variant))
    cluster.namespace(NAMESPACE)  # its default ServiceAccount, as the controller-manager makes


def gate_env(cluster: Cluster, node: str, feed: str, cache: Path) -> dict[str, str]:
    """The DaemonSet's environment (deploy/reboot-gate/fluo/0500_daemonset.yaml) for node."""
    daemonset = next(
        doc
        for doc in yaml.safe_load_all((MANIFESTS / "fluo" / "0500_daemonset.yaml").read_text())
        if doc and doc["kind"] == "DaemonSet"
    )
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    return {
        "PATH": os.environ["PATH"],
        **env,
        "NODE_NAME": node,  # the downward API's spec.nodeName
        "POD_NAMESPACE": NAMESPACE,  # and metadata.namespace
        "REBOOT_GATE_API_SERVER": cluster.url,
        "FLATCAR_RELEASES_URL": feed,
        "NVIDIA_DRIVER_CACHE_DIR": str(cache / "cache"),  # the pod's emptyDir
        "NVIDIA_DRIVER_WORK_DIR": str(cache / "work"),
    }


def run_gate_once(cluster: Cluster, env: dict[str, str], workdir: Path, manager: str = "fluo",
                  system_bus: Path | None = None, *, others: bool = False
                  ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``nvidia-driver reboot-gate --manager <manager> --once`` with the ServiceAccount's
    token, as the pod would run it (``--others``: as deploy/reboot-gate/fluo's Deployment runs
    it); with ``system_bus`` (a directory holding a private bus's
    ``system_bus_socket``) mounted at /run/dbus, as the kured variant mounts the host's
    (deploy/reboot-gate/kured/0500_daemonset.yaml), so the gate finds it where it looks
    (gate/updateengine.py SYSTEM_BUS)."""
    secrets = workdir / "serviceaccount"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "token").write_text(cluster.token(NAMESPACE, ACCOUNT))
    (secrets / "ca.crt").write_bytes(cluster.ca.read_bytes())
    (secrets / "namespace").write_text(NAMESPACE)
    # A tmpfs over /run (/var/run's target) in the gate's own mount namespace: the directory
    # is made there, not on the host. The FLUO variant reads nothing else under /run; the
    # kured variant reads the bus there, and gets only the private one (or none).
    script = (
        "set -e; mount -t tmpfs gdc-run /run; "
        f'mkdir -p {SERVICE_ACCOUNT_DIR}; mount --bind "$1" {SERVICE_ACCOUNT_DIR}; '
        'if [ -n "$2" ]; then mkdir -p /run/dbus; mount --bind "$2" /run/dbus; fi; '
        'shift 2; exec "$@"'
    )
    bus = str(system_bus) if system_bus is not None else ""
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(secrets),
            bus, sys.executable, "-m", "nvidia_driver", "reboot-gate", "--manager", manager,
            "--once", *(["--others"] if others else [])]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                            timeout=300)  # fmt: skip
    with (cluster.logs / "reboot-gate.log").open("a") as log:
        log.write(f"$ reboot-gate --once ({result.returncode})\n{result.stdout}{result.stderr}\n")
    return result


def push_image(registry: str, repository: str, tag: str, arch: str = "amd64") -> str:
    """A one-arch image with no layers, pushed to a registry on 127.0.0.1 (OCI distribution
    API): what the gate reads of an image is its manifest and its config's platform."""
    config = json.dumps({"architecture": arch, "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()  # fmt: skip
    digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    start = urllib.request.Request(f"http://{registry}/v2/{repository}/blobs/uploads/",
                                   method="POST", data=b"")  # fmt: skip
    with urllib.request.urlopen(start, timeout=30) as answer:  # noqa: S310 - loopback registry
        location = answer.headers["Location"]
    upload = location if location.startswith("http") else f"http://{registry}{location}"
    separator = "&" if "?" in upload else "?"
    put = urllib.request.Request(  # noqa: S310 - loopback registry
        f"{upload}{separator}digest={digest}",
        method="PUT",
        data=config,
        headers={"Content-Type": "application/octet-stream"},
    )
    urllib.request.urlopen(put, timeout=30).close()  # noqa: S310 - loopback registry
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest,
                   "size": len(config)},
        "layers": [],
    }).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{tag}",
        method="PUT",
        data=manifest,
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    )
    urllib.request.urlopen(request, timeout=30).close()  # noqa: S310 - loopback registry
    return f"{registry}/{repository}:{tag}"


def kubelet_pulled(cluster: Cluster, node: str) -> list[str]:
    """The gate's pre-pull pods on node, finished as the kubelet reports them once it has pulled
    the image and run its no-op (``PATCH pods/<name>/status``: no kubelet runs here). The pods
    must have passed the real API server's RBAC and the namespace's restricted Pod Security
    admission to exist at all. Their images."""
    pods = cluster.items(f"/api/v1/namespaces/{NAMESPACE}/pods",
                         f"gpu-driver-container/prepull-node={node}")  # fmt: skip
    for pod in pods:
        assert pod["spec"]["nodeName"] == node
        (container,) = pod["spec"]["containers"]
        status = {"phase": "Succeeded", "containerStatuses": [{
            "name": container["name"], "image": container["image"], "imageID": "",
            "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }]}  # fmt: skip
        cluster.request("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
                        "/status", {"status": status},
                        content_type="application/merge-patch+json")  # fmt: skip
    return [pod["spec"]["containers"][0]["image"] for pod in pods]


def node_event_reasons(cluster: Cluster, node: str) -> list[str]:
    """The reasons of the events about node, in every namespace: what ``kubectl describe node``
    lists."""
    return [event["reason"] for event in cluster.items("/api/v1/events")
            if event["involvedObject"].get("kind") == "Node"
            and event["involvedObject"].get("name") == node]  # fmt: skip
