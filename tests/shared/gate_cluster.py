"""A GPU cluster for the reboot gate to judge: Flatcar GPU nodes, the Operator's resources, a
registry, Flatcar's feed, and the gate and its checker wired to them.

The objects live in an API server behind ``Store``: the session's real kube-apiserver
(tests/integration/cluster/gate_store.py), where the gate's decisions are tested, or the unit
tests' fake_apiserver.py, kept only for the faults a real server cannot be made to produce.

The nodes carry the labels NFD and the GPU Operator give a Flatcar GPU node
(``feature.node.kubernetes.io/system-os_release.ID`` and ``.VERSION_ID``,
``kernel-version.full``, ``nvidia.com/gpu.present``); the releases and kernels are real ones,
from the feed that flatcar_feed.py makes of Flatcar's release history.
"""

from __future__ import annotations

import copy
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from flatcar_feed import feed_from_tsv
from gate_manifests import DEPLOY
from oci_registry import OCIRegistry

from nvidia_driver.cli import parser
from nvidia_driver.commands import Commands
from nvidia_driver.gate.buildcheck import BuildImage
from nvidia_driver.gate.gate import Gate, Settings
from nvidia_driver.gate.kubeapi import KubeAPI
from nvidia_driver.gate.managers import BEFORE_REBOOT, NEW_VERSION, TRUE, Manager
from nvidia_driver.gate.registry import Registry
from nvidia_driver.gate.verdict import Checker, Releases, Verdict
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits
from nvidia_driver.sources.http import Client, Limits

NAMESPACE = "nvidia-reboot-gate"  # deploy/reboot-gate/common/0000_namespace.yaml
OPERATOR_NAMESPACE = "gpu-operator"
CLUSTER_POLICY = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
# Real releases (the feed's TSV): stable 4593.2.4 has 6.12.95, 4593.2.5 6.12.102; beta
# 4628.1.1 has 6.12.87.
CURRENT, STAGED = "4593.2.4", "4593.2.5"
KERNELS = {
    "4593.2.4": "6.12.95-flatcar",
    "4593.2.5": "6.12.102-flatcar",
    "4628.1.1": "6.12.87-flatcar",
    "4628.1.2": "6.12.91-flatcar",
}


def fluo_asks(version: str = STAGED) -> Callable[[dict[str, Any]], None]:
    """A change to a node: FLUO asking about a reboot into version, as the gate's turn finds it:
    its operator's before-reboot=true label and its agent's new-version annotation
    (flatcar-linux-update-operator pkg/constants)."""

    def change(node: dict[str, Any]) -> None:
        node["metadata"].setdefault("labels", {})[BEFORE_REBOOT] = TRUE
        node["metadata"].setdefault("annotations", {})[NEW_VERSION] = version

    return change


class Clock:
    """A clock the test moves: the registry client's time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Store(Protocol):
    """The objects of an API server, as a test (not the gate) reads and writes them."""

    @property
    def url(self) -> str: ...

    def put(self, path: str, document: dict[str, Any]) -> dict[str, Any]: ...

    def get(self, path: str) -> dict[str, Any]: ...

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]: ...

    def items(self, path: str) -> list[dict[str, Any]]: ...


def node(
    name: str,
    version: str,
    *,
    gpu: bool = True,
    arch: str = "amd64",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    every = {
        "kubernetes.io/arch": arch,
        "kubernetes.io/hostname": name,
        "feature.node.kubernetes.io/system-os_release.ID": "flatcar",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": version,
        "feature.node.kubernetes.io/kernel-version.full": KERNELS[version],
        "flatcar-linux-update.v1.flatcar-linux.net/id": "flatcar",
        "flatcar-linux-update.v1.flatcar-linux.net/version": version,
    }
    if gpu:
        every["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**every, **(labels or {})},
            # The kubelet's own (pkg/kubelet kubelet_node_status.go): a real node has it.
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "status": {
            "nodeInfo": {
                "architecture": arch,
                "osImage": f"Flatcar Container Linux by Kinvolk {version} (Oklo)",
            }
        },
    }


@dataclass
class GateCluster:
    """The cluster a test builds for the gate, on ``api``.

    ``token`` is what the gate sends (its ServiceAccount's, on a real server); ``context`` the
    TLS context that trusts the server's CA. ``policy_spec`` is the ClusterPolicy's spec
    before the test's driver fields: the GPU Operator's sample on a real server, whose CRD
    requires its other fields.
    """

    api: Store
    registry: OCIRegistry
    tmp: Path
    token: str
    context: ssl.SSLContext | None = None
    policy_spec: dict[str, Any] = field(default_factory=dict)
    feed: dict[str, Any] = field(default_factory=feed_from_tsv)
    sleeps: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_file = self.tmp / "token"
        self.token_file.write_text(self.token + "\n")
        self.feed_file = self.tmp / "releases.json"
        self.write_feed()

    @property
    def repository(self) -> str:
        return f"{self.registry.host}/o"

    def write_feed(self) -> None:
        self.feed_file.write_text(json.dumps(self.feed))

    def add_node(self, name: str, version: str = CURRENT, **options: Any) -> dict[str, Any]:
        return self.api.put(f"/api/v1/nodes/{name}", node(name, version, **options))

    def cluster_policy(
        self,
        version: str,
        *,
        precompiled: bool = False,
        secrets: tuple[str, ...] = (),
        crd: bool = False,
    ) -> None:
        spec = copy.deepcopy(self.policy_spec)
        driver = spec.setdefault("driver", {})
        driver.update(
            {
                "repository": self.repository,
                "image": "driver",
                "version": version,
                "usePrecompiled": precompiled,
            }
        )
        if secrets:
            driver["imagePullSecrets"] = list(secrets)
        if crd:
            driver["useNvidiaDriverCRD"] = True
        self.api.put(
            CLUSTER_POLICY,
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy"},
                "spec": spec,
                "status": {"state": "ready", "namespace": OPERATOR_NAMESPACE},
            },
        )

    def nvidia_driver(self, name: str, version: str, **spec: Any) -> None:
        """An NVIDIADriver (v1alpha1) installing driver version from the cluster's registry."""
        self.api.put(
            f"/apis/nvidia.com/v1alpha1/nvidiadrivers/{name}",
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "NVIDIADriver",
                "spec": {
                    "driverType": "gpu",
                    "repository": self.repository,
                    "image": "driver",
                    "version": version,
                    **spec,
                },
            },
        )

    def gpu_cluster(self) -> None:
        """v26.7's GPUCluster: its CRD pins the one name (controllers/active_config.go)."""
        self.api.put(
            "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster",
            {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "spec": {"draDriver": {}}},
        )

    def published(self, version: str = "610.57.04") -> str:
        """Node gpu-1 and a ClusterPolicy for driver version, its staged release's tag
        published; the tag."""
        self.add_node("gpu-1")
        self.cluster_policy(version)
        tag = f"{version}-flatcar{STAGED}"
        self.publish(tag)
        return tag

    def publish(self, tag: str, arches: tuple[str, ...] = ("amd64",)) -> None:
        self.registry.add_image("o/driver", [tag], arches)

    def api_client(self) -> KubeAPI:
        return KubeAPI(
            self.api.url,
            token_file=self.token_file,
            client=Client(Limits(timeout=5, deadline=10), self.context),
            backoff=Backoff(attempts=3, first_delay=0.5),
            sleep=self.sleeps.append,
        )

    def checker(self, api: KubeAPI, build: BuildImage | None = None) -> Checker:
        downloader = Downloader(DownloadLimits(timeout=5, deadline=10), Backoff(attempts=1))
        commands = Commands({"PATH": str(self.tmp / "no-compilers")})
        releases = FlatcarReleases(commands, self.tmp / "cache", self.tmp / "work")
        return Checker(
            api,
            Releases(self.feed_file.as_uri(), downloader),
            build or BuildImage("610.57.04", commands, releases),
            operator_namespace=OPERATOR_NAMESPACE,
            registry=Registry(
                backoff=Backoff(attempts=2, first_delay=0.5),
                sleep=self.sleeps.append,
                jitter=float,  # the backoff's own pauses
            ),
            prefs=self.tmp / "prefs",
        )

    def gate(
        self,
        name: str,
        manager: Manager = Manager.FLUO,
        *,
        build: BuildImage | None = None,
        **settings: Any,
    ) -> Gate:
        api = self.api_client()
        pod = f"nvidia-reboot-gate-{name}"
        return Gate(
            Settings(name, manager, NAMESPACE, pod_name=pod, **settings),
            api,
            self.checker(api, build),
        )

    def judge(self, name: str = "gpu-1", staged: str = STAGED) -> Verdict:
        """The checker's verdict on node name's reboot into staged."""
        return self.checker(self.api_client()).verdict(self.node(name), staged)

    def others_gate(self) -> Gate:
        """The FLUO variant's Deployment (``reboot-gate --others``), run as its container's args
        say."""
        document = yaml.safe_load((DEPLOY / "fluo" / "0600_deployment.yaml").read_text())
        [container] = document["spec"]["template"]["spec"]["containers"]
        args = parser().parse_args(container["args"])
        assert args.others
        return self.gate("", Manager(args.manager), others=args.others)

    def node(self, name: str) -> dict[str, Any]:
        return self.api.get(f"/api/v1/nodes/{name}")

    def events(self) -> list[dict[str, Any]]:
        """The node events: in default, where the API server keeps cluster-scoped objects'."""
        found = self.api.items("/api/v1/namespaces/default/events")
        return sorted(found, key=lambda event: int(event["metadata"]["resourceVersion"]))
