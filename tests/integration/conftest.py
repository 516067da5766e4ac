"""Fixtures shared by the integration tests (root: ``pytest tests/integration -m integration``)."""

from __future__ import annotations

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
from fixtures.gpg import SigningKey, generate_signing_key
from fixtures.kernel import KernelTree, kernel_tree
from fixtures.release_server import (
    TEST_RELEASE,
    FlatcarReleaseServer,
    ReleaseArtifacts,
    build_release_artifacts,
    sign_release,
)

# What the integration tests run on a fresh Debian 12 machine, besides what fixtures fetch.
HOST_PACKAGES = (
    "gcc-12", "make", "dwarves", "kmod", "patch", "gnupg", "gpgv", "zstd", "xz-utils",
    "e2fsprogs", "debootstrap", "cpio",
)  # fmt: skip


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


# --- Docker, a local registry and a base image (test_images.py) --------------------------------


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
    """A local Debian trixie minbase image, the stand-in for debian:trixie-slim."""
    return base_image()
