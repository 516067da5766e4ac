"""The real GPU Operator renders the driver DaemonSet; the image it asks for is one we publish.

Nodes are registered as a Flatcar GPU node's kubelet registers them and labelled as NFD labels
them (operator.flatcar_node); the Operator (peers.toml's release, run out of cluster) reads them
and the ClusterPolicy or NVIDIADriver, and writes its DaemonSets. The image of each must be a
reference ``invoke tags`` prints for that node's release: the tooling's tag scheme against the
Operator's own code, not against our reading of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import APIError, Cluster
from fixtures.release_server import TEST_RELEASE
from gpu_operator import (
    NAMESPACE,
    flatcar_node,
    install_crds,
    register_node,
    running_operator,
    sample,
    wait_for,
)

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = "ghcr.io/gdc-test"  # composed into tags only: nothing is pulled
DRIVER = "595.91.07"  # the Operator v26.7's default driver
BRANCH = DRIVER.split(".", 1)[0]
# Two releases on one kernel (tests/shared/resources/flatcar-releases-recent.tsv): stable
# 4459.2.0 and alpha 4515.0.0 both run 6.12.54.
STABLE, ALPHA, KERNEL = "4459.2.0", "4515.0.0", "6.12.54-flatcar"
DRIVER_CONTAINER = "nvidia-driver-ctr"
QUIET_LOOKS = 3  # seconds without a driver DaemonSet after a scenario: the Operator has settled
# The driver container as this Operator renders it, which the docker harness runs.
RENDERED = ROOT / "tests" / "integration" / "data" / "gpu-operator-v25.3.4-nvidia-driver-ctr.json"
RENDERED_FIELDS = ("name", "command", "args", "env", "volumeMounts", "startupProbe", "lifecycle",
                   "securityContext")  # fmt: skip
# A one-character change to our tag scheme, run in the same tasks.py (the check must fail).
MUTANT = "import nvidia_driver.sources.gpuoperator as g; g.OS_ID = 'Flatcar'; "


def published(variant: str, version: str, feed: str, *, scheme: str = "") -> set[str]:
    """What ``invoke tags`` prints for one release: every reference we would publish."""
    run = "import sys; from invoke.main import program; program.run(['invoke', *sys.argv[1:]])"
    code = f"{scheme}{run}"
    argv = [sys.executable, "-c", code, "--search-root", str(ROOT), "tags", "--variant", variant,
            "--driver-version", DRIVER, "--flatcar-version", version, "--registry", REGISTRY,
            "--releases-url", feed]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def driver_images(cluster: Cluster) -> dict[str, str]:
    """DaemonSet name -> the image of its driver container, of the Operator's driver DaemonSets."""
    found = {}
    for daemonset in cluster.items(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"):
        for container in daemonset["spec"]["template"]["spec"]["containers"]:
            if container["name"] == DRIVER_CONTAINER:
                found[daemonset["metadata"]["name"]] = container["image"]
    return found


@pytest.fixture(scope="module")
def operator_running(cluster: Cluster, peer_dirs: dict[str, Path], operator_module: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # fmt: skip
    cluster.namespace(NAMESPACE)
    install_crds(cluster, operator_module)
    binary = peer_dirs["gpu-operator"] / "gpu-operator"
    # The node the Operator runs on: a Flatcar node too.
    host = dataclasses.replace(TEST_RELEASE, version=STABLE).os_release()
    with running_operator(cluster, binary, operator_module, tmp_path_factory.mktemp("operator"),
                          host):  # fmt: skip
        yield cluster


@pytest.fixture
def clean(operator_running: Cluster) -> Iterator[Cluster]:
    """No policy, driver resource, DaemonSet or node left for the next scenario (no garbage
    collector runs here: the DaemonSets the Operator owned are deleted by hand)."""
    yield operator_running
    daemonsets = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
    for path in ("/apis/nvidia.com/v1/clusterpolicies", "/apis/nvidia.com/v1alpha1/nvidiadrivers",
                 daemonsets, "/api/v1/nodes"):  # fmt: skip
        _delete_all(operator_running, path)
    # A reconcile in flight may write a DaemonSet after its owner is gone: until none is left
    # for a few seconds, delete what appears.
    quiet = 0
    for _ in range(60):
        quiet = 0 if _delete_all(operator_running, daemonsets) else quiet + 1
        if quiet == QUIET_LOOKS:
            break
        time.sleep(1)


def _delete_all(cluster: Cluster, path: str) -> int:
    deleted = 0
    for item in cluster.items(path):
        try:
            cluster.request("DELETE", f"{path}/{item['metadata']['name']}")
            deleted += 1
        except APIError as error:
            if error.status != 404:
                raise
    return deleted


def cluster_policy(module: Path, **driver: Any) -> dict[str, Any]:
    policy = sample(module, "v1_clusterpolicy.yaml")
    policy["spec"]["driver"].update({"repository": REGISTRY, "image": "driver", **driver})
    return policy


def rendered(cluster: Cluster, count: int = 1) -> dict[str, str]:
    log = cluster.logs / "gpu-operator.log"
    return wait_for(f"{count} driver DaemonSet(s)",
                    lambda: (images := driver_images(cluster)) and len(images) >= count and images,
                    log)  # fmt: skip


def stable_node_images(cluster: Cluster, module: Path, **driver: Any) -> dict[str, str]:
    """What the Operator renders for one Flatcar stable node under the ClusterPolicy sample with
    these driver fields."""
    register_node(cluster, flatcar_node("gpu-stable", STABLE, KERNEL))
    cluster.apply(cluster_policy(module, **driver))
    return rendered(cluster)


def test_cluster_policy_default_asks_for_a_published_precompiled_tag(
    clean: Cluster, operator_module: Path, releases_feed: str
) -> None:
    (image,) = stable_node_images(clean, operator_module, version=DRIVER).values()
    assert image in published("precompiled", STABLE, releases_feed)


def test_the_driver_container_is_the_one_the_integration_suite_runs(
    clean: Cluster, operator_module: Path
) -> None:
    """The Operator's driver container, kept in tests/integration/data for the docker harness
    (test_operator_daemonset.py): the file is what this Operator renders, field for field."""
    (name,) = stable_node_images(clean, operator_module, version=DRIVER)
    daemonset = clean.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{name}")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == DRIVER_CONTAINER]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    found = {key: container[key] for key in RENDERED_FIELDS if key in container}
    found["volumes"] = [volumes[mount["name"]] for mount in container["volumeMounts"]]
    if os.environ.get("GDC_WRITE_RENDERED") == "1":
        RENDERED.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    assert found == json.loads(RENDERED.read_text()), (
        f"the Operator renders another driver container than {RENDERED.name}: if that is the "
        "Operator's new version, rerun with GDC_WRITE_RENDERED=1 and review the diff"
    )


def test_cluster_policy_build_image_version_asks_for_a_published_alias(
    clean: Cluster, operator_module: Path, releases_feed: str
) -> None:
    (image,) = stable_node_images(clean, operator_module, version=f"{DRIVER}-flatcar").values()
    assert image in published("build", STABLE, releases_feed)


def test_use_precompiled_asks_for_a_published_per_kernel_tag(
    clean: Cluster, operator_module: Path, releases_feed: str
) -> None:
    (image,) = stable_node_images(
        clean, operator_module, version=BRANCH, usePrecompiled=True
    ).values()
    assert image in published("precompiled", STABLE, releases_feed)


def test_a_one_character_change_to_our_tag_scheme_fails_the_check(
    clean: Cluster, operator_module: Path, releases_feed: str
) -> None:
    (image,) = stable_node_images(clean, operator_module, version=DRIVER).values()
    mutated = published("precompiled", STABLE, releases_feed, scheme=MUTANT)
    assert mutated, "the mutated tasks.py published nothing"
    assert image not in mutated


def test_nvidia_driver_resource_asks_each_pool_for_its_own_release(
    clean: Cluster, operator_module: Path, releases_feed: str
) -> None:
    register_node(clean, flatcar_node("gpu-stable", STABLE, KERNEL))
    register_node(clean, flatcar_node("gpu-alpha", ALPHA, KERNEL))
    clean.apply(cluster_policy(operator_module, version=DRIVER, useNvidiaDriverCRD=True))
    driver = sample(operator_module, "nvidia_v1alpha1_nvidiadriver.yaml")
    driver["spec"].update({"repository": REGISTRY, "image": "driver", "version": DRIVER})
    clean.apply(driver)
    images = set(rendered(clean, count=2).values())
    assert images <= published("precompiled", STABLE, releases_feed) | published(
        "precompiled", ALPHA, releases_feed
    )
    assert len(images) == 2, images  # one pool per release


def test_use_precompiled_with_two_releases_on_one_kernel_is_refused_by_the_operator(
    clean: Cluster, operator_module: Path
) -> None:
    """What a reboot into a release whose kernel another GPU node's release shares does under
    usePrecompiled: the Operator refuses the whole ClusterPolicy ("different OS versions found
    for the same kernel version", object_controls.go precompiledDriverDaemonsets, in v25.3.4
    and v26.7.0 alike) and renders no driver DaemonSet at all, for any node. The reboot gate
    must hold such a reboot (issue 37, fault 2)."""
    log = clean.logs / "gpu-operator.log"
    start = log.stat().st_size  # what the Operator says from here on
    register_node(clean, flatcar_node("gpu-stable", STABLE, KERNEL))
    register_node(clean, flatcar_node("gpu-alpha", ALPHA, KERNEL))
    clean.apply(cluster_policy(operator_module, version=BRANCH, usePrecompiled=True))
    refused = f"different OS versions found for the same kernel version {KERNEL}".encode()
    wait_for("the Operator's refusal", lambda: refused in log.read_bytes()[start:], log)
    assert driver_images(clean) == {}
