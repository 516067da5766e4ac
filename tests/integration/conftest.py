"""Fixtures shared by the integration tests (root: ``pytest tests/integration -m integration``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from fixtures.debian import ensure_debian_sources, ensure_packages
from fixtures.docker_env import (
    DockerDaemon,
    Registry,
    base_image,
    local_registry,
    start_dockerd,
    stop_dockerd,
)
from fixtures.driver_server import DriverDownloads, serve_driver_downloads
from fixtures.gpg import SigningKey, generate_signing_key
from fixtures.images import DRIVER, HOST_PACKAGES, Invoke, make_invoke
from fixtures.kernel import KernelTree, kernel_tree
from fixtures.release_server import (
    TEST_RELEASE,
    FlatcarReleaseServer,
    ReleaseArtifacts,
    build_release_artifacts,
    sign_release,
)
from fixtures.runfile import build_run_fixture


@pytest.fixture(scope="session", autouse=True)
def debian_host_packages() -> None:
    """The project's Debian sources (NVIDIA, backports, trixie pinned low) and the host tools."""
    ensure_debian_sources()
    ensure_packages(HOST_PACKAGES)


@pytest.fixture(scope="session")
def flatcar_kernel_tree() -> KernelTree:
    """Debian's 6.12.95+deb12-cloud-amd64 as a Flatcar-shaped, cached kernel tree."""
    return kernel_tree(TEST_RELEASE.kernel)


@pytest.fixture(scope="session")
def flatcar_release_artifacts(flatcar_kernel_tree: KernelTree) -> ReleaseArtifacts:
    """The test release's cached artifacts (vmlinuz, config, tarball, devcontainer, DIGESTS)."""
    return build_release_artifacts(TEST_RELEASE, flatcar_kernel_tree)


@pytest.fixture(scope="session")
def flatcar_signing_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SigningKey]:
    """A throwaway release signing key; .public_keyring is what gpgv --keyring takes."""
    key = generate_signing_key(tmp_path_factory.mktemp("flatcar-signing-key"))
    yield key
    key.close()


@pytest.fixture(scope="session")
def flatcar_release_server_session(
    flatcar_release_artifacts: ReleaseArtifacts,
    flatcar_signing_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FlatcarReleaseServer]:
    """The release server for the whole session; tests should use flatcar_release_server."""
    signatures = sign_release(
        flatcar_release_artifacts, flatcar_signing_key, tmp_path_factory.mktemp("flatcar-sigs")
    )
    server = FlatcarReleaseServer(flatcar_release_artifacts, signatures, flatcar_signing_key)
    yield server
    server.close()


@pytest.fixture
def flatcar_release_server(
    flatcar_release_server_session: FlatcarReleaseServer,
) -> Iterator[FlatcarReleaseServer]:
    """The release server, with the faults and request counts of this test cleared after it."""
    yield flatcar_release_server_session
    flatcar_release_server_session.reset()


# --- Docker, a local registry, a base image and the images under test ---------------------


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    """The project's dockerd (no bridge, no iptables), started if it is not running."""
    daemon = start_dockerd()
    yield daemon
    stop_dockerd(daemon)


@pytest.fixture(scope="session")
def docker_registry(
    docker_daemon: DockerDaemon, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Registry]:
    """Debian's docker-registry on 127.0.0.1, empty at the start of the session."""
    with local_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def docker_base_image(docker_daemon: DockerDaemon) -> str:
    """A local Debian forky minbase image, the stand-in for debian:forky-slim."""
    return base_image()


@pytest.fixture(scope="session")
def driver_downloads() -> Iterator[DriverDownloads]:
    """NVIDIA's download sites on 127.0.0.1: the fixture .run and the fabric manager redist."""
    downloads = serve_driver_downloads(DRIVER, build_run_fixture(DRIVER))
    yield downloads
    downloads.close()


@pytest.fixture(scope="session")
def invoke(  # noqa: PLR0917 - pytest passes fixtures by name
    docker_daemon: DockerDaemon,
    docker_registry: Registry,
    docker_base_image: str,
    driver_downloads: DriverDownloads,
    flatcar_release_server_session: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
) -> Iterator[Invoke]:
    """tasks.py against this session's servers and registry; its images are untagged after."""
    runner = make_invoke(
        docker_daemon,
        docker_registry,
        docker_base_image,
        driver_downloads,
        flatcar_release_server_session,
        flatcar_signing_key,
    )
    yield runner
    runner.remove_images()


@pytest.fixture(scope="session")
def build_image(invoke: Invoke) -> subprocess.CompletedProcess[str]:
    """``invoke build --variant build``, once per session: every image test shares it."""
    return invoke.run("build", "build")


@pytest.fixture(scope="session")
def precompiled_image(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> subprocess.CompletedProcess[str]:
    """``invoke build --variant precompiled`` (on the session's build image), once per session."""
    return invoke.run("build", "precompiled")
