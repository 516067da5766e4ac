"""``nvidia-driver build --flatcar-version``, end to end, against real kernels.

A Flatcar release server on 127.0.0.1 serves a test release whose kernel is Debian's
6.12.95+deb12-cloud-amd64 (its real vmlinuz, build tree and a developer container), signed with
a throwaway key. The driver is NVIDIA 535.261.03 from a fixture .run made of Debian's packages.
The modules built by the project's code are then insmod'ed into that same kernel under QEMU:
nvidia.ko must get as far as looking for a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.gpg import SigningKey
from fixtures.http_server import Fault
from fixtures.qemu import DEFAULT_KERNEL, boot_and_insmod
from fixtures.release_server import (
    CONTAINER_TARBALL,
    DEVELOPER_CONTAINER,
    TEST_RELEASE,
    VMLINUZ,
    FlatcarReleaseServer,
)
from fixtures.runfile import build_run_fixture

from nvidia_driver.commands import Commands
from nvidia_driver.packages import Package, install_package, load_package

pytestmark = pytest.mark.integration

DRIVER = "535.261.03"
VERSION = TEST_RELEASE.version
NO_GPU = "NVRM: No NVIDIA GPU found"
BROKEN_BUILD = ("Invalid module format", "Unknown symbol")


@dataclass(frozen=True)
class Build:
    result: subprocess.CompletedProcess[str]
    seconds: float
    output_dir: Path

    @property
    def log(self) -> str:
        return self.result.stdout + self.result.stderr

    def package(self, module_type: str) -> Package:
        [metadata] = (self.output_dir / module_type).glob("*/metadata.json")
        package = load_package(metadata.parent)
        assert package is not None
        return package


@pytest.fixture(scope="session")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image-like root: the driver's module sources at /usr/src/nvidia-<version>."""
    runfile = build_run_fixture(DRIVER)
    root = tmp_path_factory.mktemp("image-root")
    extracted = tmp_path_factory.mktemp("run") / "extracted"
    # Extract as NVIDIA's users do, with the .run's own stub.
    subprocess.run(["sh", runfile, "-x", "--target", extracted], check=True, capture_output=True)
    sources = root / "usr" / "src" / f"nvidia-{DRIVER}"
    sources.mkdir(parents=True)
    for tree in ("kernel", "kernel-open"):
        shutil.copytree(extracted / tree, sources / tree, symlinks=True)
    return root


def path_without_gcc(directory: Path) -> str:
    """A PATH with every system tool but gcc: this 'image' has no gcc of the kernel's version."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = re.compile(r"^(gcc|cc|c89|c99|x86_64-linux-gnu-gcc)")
    for system_dir in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for tool in Path(system_dir).iterdir():
            link = directory / tool.name
            if not hidden.match(tool.name) and not link.exists() and not link.is_symlink():
                link.symlink_to(tool)
    return str(directory)


@dataclass
class Builder:
    root: Path
    server: FlatcarReleaseServer
    key: SigningKey
    cache: Path
    scratch: Path

    def env(self, **overrides: str) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "NVIDIA_DRIVER_HOST_ROOT": str(self.root),
            "NVIDIA_DRIVER_CACHE_DIR": str(self.cache),
            "NVIDIA_DRIVER_WORK_DIR": str(self.work),
            "FLATCAR_RELEASE_BASE_URL": self.server.base_url,
            "FLATCAR_KEYRING": str(self.key.public_keyring),
            "DRIVER_VERSION": DRIVER,
            "TARGETARCH": "amd64",
            **overrides,
        }

    def build(self, module_type: str, version: str = VERSION, **env: str) -> Build:
        output = self.scratch / f"out-{module_type}-{time.monotonic_ns()}"
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "nvidia_driver", "build", "--flatcar-version", version,
             "--module-type", module_type, "--output", str(output)],
            capture_output=True, text=True, env=self.env(**env), timeout=3600, check=False,
        )  # fmt: skip
        return Build(result, time.monotonic() - started, output)

    @property
    def work(self) -> Path:
        """The cache's work directory (trees, downloads): one per cache, like a container's."""
        return self.cache.with_name(f"{self.cache.name}-work")

    def cache_entries(self) -> list[str]:
        """What the cache and its work directory hold, scratch and lock files aside."""
        entries = []
        for top in (self.cache, self.work):
            if not top.exists():
                continue
            entries += [
                str(path.relative_to(top))
                for path in top.rglob("*")
                if not any(part.startswith(".") for part in path.relative_to(top).parts)
                and path.is_file()
            ]
        return sorted(entries)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("driver-cache")


@pytest.fixture
def builder(
    driver_root: Path,
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    shared_cache: Path,
    tmp_path: Path,
) -> Builder:
    """Builds with the session's cache: downloads and trees are shared between tests."""
    return Builder(driver_root, flatcar_release_server, flatcar_signing_key, shared_cache, tmp_path)


@pytest.fixture
def cold_builder(builder: Builder, tmp_path: Path) -> Builder:
    """Builds with an empty cache of its own, to see what a failure leaves behind."""
    return Builder(builder.root, builder.server, builder.key, tmp_path / "cache", tmp_path)


@pytest.fixture(scope="session")
def open_build(
    driver_root: Path,
    flatcar_release_server_session: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    shared_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Build:
    builder = Builder(
        driver_root, flatcar_release_server_session, flatcar_signing_key, shared_cache,
        tmp_path_factory.mktemp("open"),
    )  # fmt: skip
    build = builder.build("open")
    assert build.result.returncode == 0, build.log
    return build


def test_open_modules_load_into_the_release_kernel(open_build: Build) -> None:
    package = open_build.package("open")
    assert "Extracting the kernel build tree from flatcar-container.tar.gz" in open_build.log
    assert "Building kernel modules:" in open_build.log
    assert "] 100%" in open_build.log
    assert package.metadata.kernel_release == DEFAULT_KERNEL
    assert package.metadata.compiler.startswith("gcc")
    boot = boot_and_insmod([package.path / "nvidia.ko"], DEFAULT_KERNEL)
    load = boot.load(package.path / "nvidia.ko")
    assert NO_GPU in boot.console
    assert load.errno_name == "ENODEV"
    assert not any(error in boot.console for error in BROKEN_BUILD)
    # The package's banner is exactly the /proc/version of the kernel that booted, and no other.
    assert package.metadata.banner == boot.proc_version
    assert package.matches(boot.proc_version)
    assert not package.matches(boot.proc_version.replace(" SMP ", " SMP  "))


def test_a_warm_cache_does_not_compile(open_build: Build, builder: Builder) -> None:
    server = builder.server
    server.reset()  # count only this build's requests, not the cold build's
    again = builder.build("open")
    assert again.result.returncode == 0, again.log
    assert "Found NVIDIA driver package nvidia-modules-6.12.95" in again.log
    assert "Building kernel modules" not in again.log
    assert server.request_count(server.artifact_url(CONTAINER_TARBALL)) == 0
    assert server.request_count(server.artifact_url(VMLINUZ)) == 0
    assert again.seconds < 3, f"warm rebuild took {again.seconds:.1f} s"


def test_without_the_kernels_gcc_the_developer_container_builds_proprietary_modules(
    cold_builder: Builder, tmp_path: Path
) -> None:
    """Two paths in one compile: the developer container's gcc, and the closed core linked
    on the node. (The open modules are built with the host's gcc-12 above; the images, which
    carry no gcc-12, build both types through the developer container.)"""
    build = cold_builder.build("proprietary", PATH=path_without_gcc(tmp_path / "bin"))
    assert build.result.returncode == 0, build.log
    assert "no gcc 12 is available in this image" in build.log
    assert "using the developer container of Flatcar 9999.2.0" in build.log
    package = build.package("proprietary")
    assert "12." in package.metadata.compiler
    # The closed core is shipped unlinked: nvidia.ko only exists once linked on the node.
    assert "nvidia.ko" not in package.metadata.modules
    assert {linked.module for linked in package.metadata.linked} == {
        "nvidia.ko",
        "nvidia-modeset.ko",
    }
    modules = tmp_path / "lib-modules"
    install_package(package, modules, Commands())
    nvidia = modules / "kernel" / "drivers" / "video" / "nvidia.ko"
    boot = boot_and_insmod([nvidia], DEFAULT_KERNEL)
    assert NO_GPU in boot.console
    assert boot.load(nvidia).errno_name == "ENODEV"
    assert not any(error in boot.console for error in BROKEN_BUILD)


def one_line_error(build: Build) -> str:
    assert build.result.returncode == 1, build.log
    [line] = build.result.stderr.strip().splitlines()
    assert line.startswith("ERROR: ")
    return line


@pytest.mark.parametrize(
    ("artifact", "fault", "message"),
    [
        (VMLINUZ, Fault.CORRUPT, "SHA512"),
        (f"{VMLINUZ}.sig", Fault.BAD_SIGNATURE, "signature"),
        (CONTAINER_TARBALL, Fault.TRUNCATE, CONTAINER_TARBALL),
        (CONTAINER_TARBALL, Fault.CORRUPT, "SHA512"),
    ],
    ids=["corrupted-vmlinuz", "bad-signature", "truncated-tarball", "corrupted-tarball"],
)
def test_bad_downloads_are_refused_and_leave_nothing_cached(
    cold_builder: Builder, artifact: str, fault: Fault, message: str
) -> None:
    server = cold_builder.server
    server.inject(server.artifact_url(artifact), fault)
    line = one_line_error(cold_builder.build("open"))
    assert message in line
    entries = cold_builder.cache_entries()
    assert not [entry for entry in entries if entry.startswith(("trees/", "packages/"))]
    if artifact.startswith(VMLINUZ):
        # Nothing of the refused kernel image was kept, nor a banner read from it.
        assert entries == []


def test_an_unknown_release_is_a_clear_error(cold_builder: Builder) -> None:
    line = one_line_error(cold_builder.build("open", version="9998.2.0"))
    assert "HTTP 404" in line
    assert "check the Flatcar version" in line
    assert cold_builder.cache_entries() == []


def test_no_matching_gcc_and_no_developer_container(cold_builder: Builder, tmp_path: Path) -> None:
    server = cold_builder.server
    server.inject(server.artifact_url(DEVELOPER_CONTAINER), Fault.NOT_FOUND)
    build = cold_builder.build("open", PATH=path_without_gcc(tmp_path / "bin"))
    line = one_line_error(build)
    assert "the kernel was built with gcc 12 and no gcc 12 is available" in line
    assert "the developer container is unavailable" in line
    assert not any(entry.startswith("packages/") for entry in cold_builder.cache_entries())


def test_a_failing_compile_surfaces_its_first_error(builder: Builder, tmp_path: Path) -> None:
    broken_root = tmp_path / "broken-root"
    shutil.copytree(builder.root, broken_root, symlinks=True)
    source = broken_root / "usr/src" / f"nvidia-{DRIVER}" / "kernel-open/nvidia/nv.c"
    source.write_text(source.read_text() + "\n#error this driver does not build here\n")
    # A cache of its own: the shared one holds a package for the good sources.
    broken = Builder(broken_root, builder.server, builder.key, tmp_path / "cache", tmp_path)
    build = broken.build("open")
    line = one_line_error(build)
    assert "building the NVIDIA kernel modules failed:" in line
    assert "#error this driver does not build here" in line
    [log] = re.findall(r"\(full log: (\S+)\)", line)
    assert "this driver does not build here" in Path(log).read_text()
