"""The real GPU Operator, run out of cluster against the session's API server.

``cmd/gpu-operator`` reads its manifests from absolute paths, as its image lays them out
(gpu-operator ``docker/Dockerfile``: ``COPY assets /opt/gpu-operator/``, ``COPY manifests
/opt/gpu-operator/manifests``; ``controllers/state_manager.go`` ``addState``). They come from the
same module download the binary was built from, bind-mounted there in a private mount namespace
(``unshare -m``) so the host's /opt is never touched. Its CRDs are the chart's
(``deployments/gpu-operator/crds/``), and its sample resources ``config/samples/``.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from apiserver import Cluster
from fixtures.docker_env import free_port, stop_process

NAMESPACE = "gpu-operator"
OPT = "/opt/gpu-operator"
CRDS = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml")
# The driver-manager image the chart passes (values.yaml driver.manager, operator.yaml env).
DRIVER_MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"
# What NFD labels a Flatcar node with (its system and kernel sources) and the Operator reads.
NFD_OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
NFD_VERSION_ID = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
NFD_KERNEL = "feature.node.kubernetes.io/kernel-version.full"
GPU_PRESENT = "nvidia.com/gpu.present"
# NFD's PCI label for an NVIDIA device (vendor 10de, class 0302: 3D controller).
NFD_NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"


def install_operator(cluster: Cluster, module: Path) -> None:
    """What the Operator's chart installs that a scenario needs: its namespace and its CRDs."""
    cluster.namespace(NAMESPACE)
    install_crds(cluster, module)


def install_crds(cluster: Cluster, module: Path) -> None:
    crds = module / "deployments" / "gpu-operator" / "crds"
    for name in CRDS:
        (crd,) = cluster.apply_files([crds / name])
        cluster.wait_established(crd["metadata"]["name"])


def sample(module: Path, name: str) -> dict[str, Any]:
    """One of the module's config/samples, as a starting point the scenario edits."""
    loaded = yaml.safe_load((module / "config" / "samples" / name).read_text())
    return copy.deepcopy(loaded)


def nvidia_driver(module: Path, name: str, repository: str, version: str,
                  node: str) -> dict[str, Any]:  # fmt: skip
    """An NVIDIADriver (the module's sample) that installs driver ``version`` from
    ``repository``/driver on node alone."""
    driver = sample(module, "nvidia_v1alpha1_nvidiadriver.yaml")
    driver["metadata"]["name"] = name
    driver["spec"].update({"repository": repository, "image": "driver", "version": version,
                           "nodeSelector": {"kubernetes.io/hostname": node}})  # fmt: skip
    return driver


def flatcar_node(name: str, version: str, kernel: str, arch: str = "amd64",
                 containerd: str = "1.7.23") -> dict[str, Any]:  # fmt: skip
    """A Node as a Flatcar GPU node's kubelet registers it and NFD and the Operator label it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # The kubelet's own (pkg/kubelet kubelet_node_status.go); the Operator v25.3.4
            # panics on a node with no annotations at all (state_manager.go
            # applyDriverAutoUpgradeAnnotation), which a real node never is.
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                NFD_OS_ID: "flatcar",
                NFD_VERSION_ID: version,
                NFD_KERNEL: kernel,
                NFD_NVIDIA_PCI: "true",
                GPU_PRESENT: "true",
            },
        },
        "status": {
            "nodeInfo": {
                "architecture": arch,
                "kernelVersion": kernel,
                "osImage": f"Flatcar Container Linux by Kinvolk {version} (Oklo)",
                "containerRuntimeVersion": f"containerd://{containerd}",
                "kubeletVersion": "v1.36.3",
                "operatingSystem": "linux",
                "bootID": "", "machineID": "", "systemUUID": "", "kubeProxyVersion": "",
            },
        },
    }  # fmt: skip


def register_node(cluster: Cluster, node: Mapping[str, Any]) -> None:
    """POST the node, then its status (PATCH .../status), as the kubelet does."""
    cluster.apply(node)
    cluster.request("PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status",
                    {"status": node["status"]},
                    content_type="application/merge-patch+json")  # fmt: skip


@contextlib.contextmanager
def running_operator(cluster: Cluster, binary: Path, module: Path, workdir: Path,
                     host_os_release: str) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """gpu-operator with the admin's kubeconfig, in a root of its own (a tmpfs, in a private
    mount namespace) that holds what its image and its Deployment give it: the binary, its
    manifests at /opt/gpu-operator, and the node's /etc/os-release at /host-etc/os-release
    (the chart's hostPath mount, which the driver state reads: object_controls.go
    parseOSRelease)."""
    opt = workdir / "opt-gpu-operator"
    shutil.rmtree(opt, ignore_errors=True)
    shutil.copytree(module / "assets", opt)
    shutil.copytree(module / "manifests", opt / "manifests")
    os_release = workdir / "os-release"
    os_release.write_text(host_os_release)
    kubeconfig = cluster.kubeconfig(workdir / "operator.kubeconfig")
    root = workdir / "root"
    root.mkdir(exist_ok=True)
    # The kubeconfig names the cluster's certificates by their paths: the cluster's directory
    # is mounted at the same path inside.
    shared = sorted({str(binary.parent), str(cluster.pki), str(workdir)})
    script = "\n".join([
        "set -e",
        'root="$1"; opt="$2"; os_release="$3"; shift 3',
        'mount -t tmpfs gdc-operator-root "$root"',
        f'mkdir -p "$root{OPT}" "$root/host-etc" "$root/tmp"',
        f'mount --bind "$opt" "$root{OPT}"',
        ': > "$root/host-etc/os-release"',
        'mount --bind "$os_release" "$root/host-etc/os-release"',
        *(f'mkdir -p "$root{path}"; mount --bind "{path}" "$root{path}"' for path in shared),
        'exec chroot "$root" "$@"',
    ])  # fmt: skip
    argv = [
        "unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
        str(root), str(opt), str(os_release),
        str(binary), f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}", "--leader-elect=false",
    ]  # fmt: skip
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/",  # what a container runtime gives a user /etc/passwd does not list
        "KUBECONFIG": str(kubeconfig),
        "OPERATOR_NAMESPACE": NAMESPACE,
        "WATCH_NAMESPACE": "",
        "DRIVER_MANAGER_IMAGE": DRIVER_MANAGER_IMAGE,
    }
    log = cluster.logs / "gpu-operator.log"
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
    try:
        yield process
    finally:
        stop_process(process)


def wait_for(what: str, found: Callable[[], Any], log: Path, seconds: float = 120.0) -> Any:
    """found()'s first truthy answer, polled; the log's tail in the failure."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = found()
        if answer:
            return answer
        time.sleep(1.0)
    lines = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    tail = "\n".join(line[:400] for line in lines)
    raise TimeoutError(f"no {what} within {seconds:.0f} s; {log.name} ends:\n{tail}")
