"""``invoke build`` and ``invoke push`` end to end: real dockerd, real registry, loopback sources.

NVIDIA's and Flatcar's sites are stood in for on 127.0.0.1: the driver .run is the fixture
made from Debian's packages (535.261.03), the fabric manager redist is an archive in the real
layout with stand-in binaries, and the Flatcar release server serves the signed test release
9999.2.0 (Debian's 6.12.95 kernel). Builds use host networking, so build steps reach them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.docker_env import (
    DockerDaemon,
    Registry,
    docker_env,
    remove_images,
    remove_repository,
)
from fixtures.driver_server import DriverDownloads, serve_driver_downloads
from fixtures.gpg import SigningKey
from fixtures.release_server import TEST_RELEASE, FlatcarReleaseServer
from fixtures.runfile import build_run_fixture

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "535.261.03"
FLATCAR = TEST_RELEASE.version
KERNEL_TAG = TEST_RELEASE.kernel.release.replace("+", "-")
PREFIX = "flatcar-test-00000000"
BUILD_TIMEOUT = 3600
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)


@pytest.fixture(scope="session")
def driver_downloads() -> Iterator[DriverDownloads]:
    downloads = serve_driver_downloads(DRIVER, build_run_fixture(DRIVER))
    yield downloads
    downloads.close()


@dataclass(frozen=True)
class Invoke:
    """Runs tasks.py as a developer would, against this session's servers and registry."""

    registry: Registry
    selection: tuple[str, ...]
    build_options: tuple[str, ...]
    env: dict[str, str]

    def run(self, task: str, variant: str, *extra: str) -> subprocess.CompletedProcess[str]:
        options = self.build_options if task == "build" else ()
        argv = [sys.executable, "-m", "invoke", "--search-root", str(ROOT), task,
                "--variant", variant, *self.selection, *options, *extra]  # fmt: skip
        result = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT, check=False)  # fmt: skip
        assert result.returncode == 0, f"{' '.join(argv)}\n{result.stdout[-8000:]}\n{result.stderr}"
        return result

    def reference(self, tag: str) -> str:
        return f"{self.registry.address}/gdc/driver:{PREFIX}-{tag}"


@pytest.fixture(scope="module")
def invoke(  # noqa: PLR0917 - pytest passes fixtures by name
    docker_daemon: DockerDaemon,
    docker_registry: Registry,
    docker_base_image: str,
    driver_downloads: DriverDownloads,
    flatcar_release_server_session: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
) -> Iterator[Invoke]:
    server = flatcar_release_server_session
    selection = (
        "--driver-version", DRIVER, "--flatcar-version", FLATCAR, "--arch", "amd64",
        "--registry", f"{docker_registry.address}/gdc", "--prefix", PREFIX,
        "--releases-url", server.releases_json_url, "--docker-host", docker_daemon.host,
    )  # fmt: skip
    build_options = (
        "--base-image", docker_base_image,
        "--driver-sha256", driver_downloads.runfile_sha256,
        "--driver-base-url", driver_downloads.driver_base_url,
        "--fabricmanager-base-url", driver_downloads.fabricmanager_base_url,
        "--release-base-url", server.base_url,
        "--flatcar-keyring", str(flatcar_signing_key.public_keyring),
    )  # fmt: skip
    yield Invoke(docker_registry, selection, build_options, docker_env())
    remove_repository(f"{docker_registry.address}/gdc/driver")


@pytest.fixture(scope="module")
def build_image(invoke: Invoke) -> subprocess.CompletedProcess[str]:
    return invoke.run("build", "build")


@pytest.fixture(scope="module")
def precompiled_image(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> subprocess.CompletedProcess[str]:
    return invoke.run("build", "precompiled")


def _docker(*args: str) -> str:
    result = subprocess.run(["docker", *args], env=docker_env(), capture_output=True, text=True,
                            timeout=600, check=True)  # fmt: skip
    return result.stdout


def _in_image(reference: str, script: str) -> str:
    """Run script in a throwaway container (no network, entrypoint bypassed)."""
    return _docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", reference, "-c", script
    )


def _layers(reference: str) -> list[str]:
    return list(json.loads(_docker("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                   reference)))  # fmt: skip


def test_the_build_image_carries_driver_fabric_manager_and_entrypoint(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> None:
    reference = invoke.reference(f"{DRIVER}-flatcar")
    assert reference in build_image.stdout
    assert invoke.reference(f"{DRIVER}-flatcar-flatcar{FLATCAR}") in build_image.stdout
    config = json.loads(_docker("image", "inspect", "--format", "{{json .Config}}", reference))
    assert config["Entrypoint"] == ["nvidia-driver", "init"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["Env"]
    assert f"DRIVER_VERSION={DRIVER}" in config["Env"]
    assert "DRIVER_BRANCH=535" in config["Env"]
    assert "TARGETARCH=amd64" in config["Env"]
    assert config["Labels"]["org.opencontainers.image.version"] == DRIVER
    assert config["Labels"]["gpu-driver-container.flatcar-version"] == FLATCAR
    listing = _in_image(reference, (
        "nvidia-driver --help >/dev/null && echo entrypoint-ok; "
        "for t in nvidia-smi nv-fabricmanager nvidia-fabricmanager-start.sh gcc-13 gcc-14; "
        "do command -v $t; done; "
        "ls /usr/share/nvidia/nvswitch/ /usr/src/nvidia-" + DRIVER + "/; "
        "ls /var/lib/apt/lists | wc -l; ls /tmp | wc -l"
    ))  # fmt: skip
    assert "entrypoint-ok" in listing
    for path in ("/usr/bin/nvidia-smi", "/usr/bin/nv-fabricmanager", "fabricmanager.cfg",
                 "dgxh100_hgxh100_topology", "kernel-open", "/usr/bin/gcc-14"):  # fmt: skip
        assert path in listing, listing
    assert listing.split()[-2:] == ["0", "0"]  # no apt lists, no .run left behind


def test_the_precompiled_image_is_one_layer_on_the_build_image(
    invoke: Invoke, precompiled_image: subprocess.CompletedProcess[str]
) -> None:
    build = invoke.reference(f"{DRIVER}-flatcar")
    precompiled = invoke.reference(f"{DRIVER}-flatcar{FLATCAR}")
    by_kernel = invoke.reference(f"535-{KERNEL_TAG}-flatcar{FLATCAR}")
    assert by_kernel in precompiled_image.stdout
    assert "and adds 1 (" in precompiled_image.stdout
    assert _layers(precompiled)[:-1] == _layers(build)
    assert len(_layers(precompiled)) == len(_layers(build)) + 1
    packages = _in_image(by_kernel, "ls -d /opt/nvidia/precompiled/*/*/")
    assert "/opt/nvidia/precompiled/open/" in packages
    assert "/opt/nvidia/precompiled/proprietary/" in packages
    metadata = _in_image(by_kernel, "cat /opt/nvidia/precompiled/open/*/metadata.json")
    assert json.loads(metadata)["kernel_release"] == TEST_RELEASE.kernel.release
    assert json.loads(metadata)["flatcar_version"] == FLATCAR


def test_push_then_pull_back_from_the_registry(
    invoke: Invoke, precompiled_image: subprocess.CompletedProcess[str]
) -> None:
    pushed = invoke.run("push", "precompiled")
    tags = {
        "build": f"{DRIVER}-flatcar",
        "alias": f"{DRIVER}-flatcar-flatcar{FLATCAR}",
        "precompiled": f"{DRIVER}-flatcar{FLATCAR}",
        "by_kernel": f"535-{KERNEL_TAG}-flatcar{FLATCAR}",
    }
    references = {name: invoke.reference(tag) for name, tag in tags.items()}
    for reference in references.values():
        assert f"pushed {reference}@sha256:" in pushed.stdout
    remove_images(*references.values())
    for reference in references.values():
        _docker("pull", reference)
    assert _layers(references["alias"]) == _layers(references["build"])
    assert _layers(references["by_kernel"]) == _layers(references["precompiled"])
    assert _layers(references["precompiled"])[:-1] == _layers(references["build"])
    # The registry stores the shared layers once: the precompiled manifest lists the build
    # image's blobs and one more.
    build_blobs = _manifest_layers(invoke.registry, tags["build"])
    precompiled_blobs = _manifest_layers(invoke.registry, tags["precompiled"])
    assert precompiled_blobs[:-1] == build_blobs
    assert len(precompiled_blobs) == len(build_blobs) + 1


def _manifest_layers(registry: Registry, tag: str) -> list[str]:
    request = urllib.request.Request(  # noqa: S310 - the loopback registry
        f"{registry.url}/v2/gdc/driver/manifests/{PREFIX}-{tag}",
        headers={"Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        manifest = json.load(response)
    return [layer["digest"] for layer in manifest["layers"]]
