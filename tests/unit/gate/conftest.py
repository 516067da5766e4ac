"""A cluster for the reboot gate: an API server, a registry, Flatcar's feed, GPU nodes.

The API server is fake_apiserver.py: a store of objects with faults to inject, and none of the
real server's semantics (RBAC, validation, conflicts), which tests/integration/cluster tests.

The nodes carry the labels NFD and the GPU Operator give a Flatcar GPU node
(``feature.node.kubernetes.io/system-os_release.ID`` and ``.VERSION_ID``,
``kernel-version.full``, ``nvidia.com/gpu.present``); the releases and kernels are real ones,
from the feed that tests/shared/flatcar_feed.py makes of Flatcar's release history.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import FakeAPIServer
from flatcar_feed import feed_from_tsv
from gate_manifests import DEPLOY, manifests
from oci_registry import OCIRegistry

from nvidia_driver.commands import Commands
from nvidia_driver.gate.buildcheck import BuildImage
from nvidia_driver.gate.gate import Gate, Settings
from nvidia_driver.gate.http import Client, Limits
from nvidia_driver.gate.kubeapi import KubeAPI
from nvidia_driver.gate.managers import Manager
from nvidia_driver.gate.registry import Registry
from nvidia_driver.gate.verdict import Checker, Releases
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits

TOKEN = "gate-service-account-token"  # noqa: S105 - a test's, sent to the fake API server
NAMESPACE = "nvidia-reboot-gate"
# Real releases (the feed's TSV): stable 4593.2.4 has 6.12.95, 4593.2.5 6.12.102; beta
# 4628.1.1 has 6.12.87.
CURRENT, STAGED = "4593.2.4", "4593.2.5"
KERNELS = {
    "4593.2.4": "6.12.95-flatcar",
    "4593.2.5": "6.12.102-flatcar",
    "4628.1.1": "6.12.87-flatcar",
    "4628.1.2": "6.12.91-flatcar",
}


def rbac_rules(*folders: str) -> list[dict[str, Any]]:
    """The PolicyRules the manifests grant the gate's service account (Roles: with namespace):
    those of what ``kubectl apply -k`` installs from each folder (fluo and kured: common's too),
    each file once."""
    rules: list[dict[str, Any]] = []
    files = [path for folder in folders for path in manifests(DEPLOY / folder)]
    for path in dict.fromkeys(files):
        document = yaml.safe_load(path.read_text())
        if document["kind"] in {"Role", "ClusterRole"}:
            namespace = document["metadata"].get("namespace", "")
            rules += [{**rule, "namespace": namespace} for rule in document["rules"]]
    return rules


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
        "metadata": {"name": name, "labels": {**every, **(labels or {})}, "annotations": {}},
        "status": {
            "nodeInfo": {
                "architecture": arch,
                "osImage": f"Flatcar Container Linux by Kinvolk {version} (Oklo)",
            }
        },
    }


@dataclass
class Cluster:
    api: FakeAPIServer
    registry: OCIRegistry
    tmp: Path
    feed: dict[str, Any] = field(default_factory=feed_from_tsv)
    sleeps: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_file = self.tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
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
        driver: dict[str, Any] = {
            "repository": self.repository,
            "image": "driver",
            "version": version,
            "usePrecompiled": precompiled,
        }
        if secrets:
            driver["imagePullSecrets"] = list(secrets)
        if crd:
            driver["useNvidiaDriverCRD"] = True
        self.api.put(
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "metadata": {"creationTimestamp": "2026-09-01T10:00:00Z"},
                "spec": {"driver": driver},
                "status": {"state": "ready", "namespace": "gpu-operator"},
            },
        )

    def publish(self, tag: str, arches: tuple[str, ...] = ("amd64",)) -> None:
        self.registry.add_image("o/driver", [tag], arches)

    def api_client(self) -> KubeAPI:
        return KubeAPI(
            self.api.url,
            token_file=self.token_file,
            client=Client(Limits(timeout=5, deadline=10)),
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
            operator_namespace="gpu-operator",
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

    def node(self, name: str) -> dict[str, Any]:
        return self.api.get(f"/api/v1/nodes/{name}")

    def events(self) -> list[dict[str, Any]]:
        """The node events: in default, where the API server keeps cluster-scoped objects'."""
        found = self.api.items("/api/v1/namespaces/default/events")
        return sorted(found, key=lambda event: event["metadata"]["resourceVersion"].zfill(8))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeAPIServer() as api, OCIRegistry() as registry:
        yield Cluster(api, registry, tmp_path)
