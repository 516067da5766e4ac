"""Fixtures shared by the integration tests (root: ``pytest tests/integration -m integration``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.debian import ensure_debian_sources, ensure_packages
from fixtures.docker_env import (
    DockerDaemon,
    Registry,
    base_image,
    copy_from_image,
    local_registry,
    start_dockerd,
    stop_dockerd,
)
from fixtures.driver_server import DriverDownloads, serve_driver_downloads
from fixtures.gpg import SigningKey, generate_signing_key
from fixtures.hello import HELLO_REVISION, write_hello_sources
from fixtures.image_node import kbuild_module_in_image
from fixtures.images import DRIVER, HOST_PACKAGES, Invoke, make_invoke
from fixtures.kernel import KernelTree, kernel_tree
from fixtures.kernel_headers import build_kbuild_module, depends, kernel_headers, resolve
from fixtures.qemu import BootResult, boot_and_insmod
from fixtures.release_server import (
    TEST_RELEASE,
    FlatcarReleaseServer,
    ReleaseArtifacts,
    build_release_artifacts,
    sign_release,
)
from fixtures.runfile import build_run_fixture
from fixtures.warmup import warmed

from nvidia_driver.kbuild.packages import Package, load_package


@pytest.fixture(scope="session", autouse=True)
def debian_host_packages() -> None:
    """The project's Debian sources (NVIDIA, backports, trixie pinned low) and the host tools."""
    ensure_debian_sources()
    ensure_packages(HOST_PACKAGES)


@pytest.fixture(scope="session", autouse=True)
def warm_caches(request: pytest.FixtureRequest, debian_host_packages: None) -> Iterator[None]:
    """The long cache entries the collected tests need, built in threads from the start."""
    needed = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    with warmed(needed) as reports:
        request.config.stash[WARM_UP_REPORTS] = reports
        yield


WARM_UP_REPORTS = pytest.StashKey[list[str]]()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """What each warm-up took (beside --durations: the time it saved does not show there)."""
    for line in config.stash.get(WARM_UP_REPORTS, []):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def xz_runfile() -> Path:
    """The 535 fixture .run with an xz payload without integrity check, as nv2 packages carry
    (fixtures/runfile.py's COMPRESSOR_OPTIONS)."""
    return build_run_fixture(DRIVER, compression="xz")


@pytest.fixture(scope="session")
def flatcar_kernel_tree() -> KernelTree:
    """The test release's kernel (trixie's 6.12.117, gcc 14) as a Flatcar-shaped, cached tree."""
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


# --- the precompiled image's packages, insmod-ed into the release's kernel under QEMU -------


@pytest.fixture(scope="session")
def precompiled_packages(
    invoke: Invoke,
    precompiled_image: subprocess.CompletedProcess[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The precompiled image's /opt/nvidia/precompiled, copied out: <type>/<package>/."""
    destination = tmp_path_factory.mktemp("precompiled") / "precompiled"
    return copy_from_image(invoke.precompiled_reference, "/opt/nvidia/precompiled", destination)


@pytest.fixture(scope="session")
def precompiled_open_package(precompiled_packages: Path) -> Package:
    """The open modules the image build compiled (build image, gcc-14, container tarball)."""
    [metadata] = (precompiled_packages / "open").glob("*/metadata.json")
    package = load_package(metadata.parent)
    assert package is not None, metadata
    return package


@pytest.fixture(scope="session")
def hello_for_release_kernel(
    invoke: Invoke,
    build_image: subprocess.CompletedProcess[str],
    flatcar_kernel_tree: KernelTree,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The hello module built against the release kernel's tree, in the build image (its kbuild
    tools need trixie's glibc, newer than this machine's) with the kernel's gcc-14."""
    sources = write_hello_sources(tmp_path_factory.mktemp("hello") / "gdc-hello")
    [module] = kbuild_module_in_image(
        invoke.build_reference, flatcar_kernel_tree.build_dir, sources, "gcc-14"
    )
    return module


@pytest.fixture(scope="session")
def other_kernel_release() -> str:
    """Bookworm's stock cloud kernel (6.1): a kernel the 6.12 builds must not load into."""
    meta = resolve("linux-headers-cloud-amd64", suite="bookworm")
    (headers,) = [name for name in depends(meta) if name.startswith("linux-headers-")]
    return headers.removeprefix("linux-headers-")


@pytest.fixture(scope="session")
def hello_for_other_kernel(other_kernel_release: str) -> Path:
    """The hello module built on this machine (gcc-12) against bookworm's 6.1 headers."""
    built = build_kbuild_module(
        kernel_headers(other_kernel_release),
        f"gdc-hello-r{HELLO_REVISION}",
        write_hello_sources,
    )
    return built / "gdc_hello.ko"


@pytest.fixture(scope="session")
def release_kernel_boot(
    precompiled_open_package: Package, hello_for_other_kernel: Path, hello_for_release_kernel: Path
) -> BootResult:
    """One TCG boot of the release's kernel for three modules (a boot costs tens of seconds):
    the image's open nvidia.ko, and the harness's two controls."""
    # The wrong build goes first: were the good hello loaded before it, the kernel would
    # refuse the second gdc_hello as a duplicate (EEXIST), not for its format.
    nvidia = precompiled_open_package.path / "nvidia.ko"
    modules = [nvidia, hello_for_other_kernel, hello_for_release_kernel]
    return boot_and_insmod(modules, TEST_RELEASE.kernel.release)
