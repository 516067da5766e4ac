"""``nvidia-driver build``, end to end, against a real kernel and its release.

A Flatcar release server on 127.0.0.1 serves a test release whose kernel is Debian trixie's
6.12.117+deb13-cloud-amd64, built by gcc 14 as Flatcar's 4230.1.0 to 4593 are (its real
vmlinuz, container tarball and developer container), signed with a throwaway key. The driver is
NVIDIA 535.261.03 from a fixture .run made of Debian's packages.

* In the build image (``docker run``, host networking to reach the release server): a compile
  that fails says where and why.
* On this machine (no gcc-14: Debian 12): what is refused before any compile (bad downloads, an
  unknown release, no compiler and no developer container).

The open and proprietary modules from the container tarball with the image's own gcc-14 are the
precompiled image's (test_images.py, booted by test_qemu_harness.py's session boot). The
developer container's build, with its own gcc-14 where the image lacks the kernel's, is a driver
pod's runtime build, then its warm restart (test_operator_daemonset.py).
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
from fixtures.image_node import ImageBuild, build_release_in_image
from fixtures.images import Invoke
from fixtures.release_server import (
    CONTAINER_KEYRING,
    CONTAINER_TARBALL,
    DEVELOPER_CONTAINER,
    TEST_RELEASE,
    VMLINUZ,
    FlatcarReleaseServer,
)
from fixtures.runfile import build_run_fixture

pytestmark = pytest.mark.integration

DRIVER = "535.261.03"
VERSION = TEST_RELEASE.version
NV_C = f"/usr/src/nvidia-{DRIVER}/kernel-open/nvidia/nv.c"


@dataclass(frozen=True)
class Build:
    result: subprocess.CompletedProcess[str]
    seconds: float
    output_dir: Path

    @property
    def log(self) -> str:
        return self.result.stdout + self.result.stderr


def cache_entries(cache: Path, work: Path) -> list[str]:
    """What the cache and its work directory hold, scratch and lock files aside."""
    entries = []
    for top in (cache, work):
        if not top.exists():
            continue
        entries += [
            str(path.relative_to(top))
            for path in top.rglob("*")
            if not any(part.startswith(".") for part in path.relative_to(top).parts)
            and path.is_file()
        ]
    return sorted(entries)


# --- in the build image ------------------------------------------------------------------------


@dataclass
class ImageBuilder:
    """Builds in the session's build image, its cache and work directory on this machine (at the
    same paths inside, so the paths a build prints are this machine's)."""

    image: str
    server: FlatcarReleaseServer
    keyring: Path
    cache: Path
    work: Path

    def build(
        self,
        module_type: str,
        scratch: Path,
        *,
        mounts: tuple[tuple[Path, str], ...] = (),
    ) -> Build:
        env = {
            "NVIDIA_DRIVER_CACHE_DIR": str(self.cache),
            "NVIDIA_DRIVER_WORK_DIR": str(self.work),
            **self.server.container_env(),
        }
        volumes = (
            (self.cache, str(self.cache)),
            (self.work, str(self.work)),
            (self.keyring, f"{CONTAINER_KEYRING}:ro"),
            *mounts,
        )
        started = time.monotonic()
        built: ImageBuild = build_release_in_image(
            self.image, VERSION, module_type, scratch, env=env, mounts=volumes
        )
        return Build(built.result, time.monotonic() - started, built.output)


def image_builder(
    invoke: Invoke, server: FlatcarReleaseServer, key: SigningKey, directory: Path
) -> ImageBuilder:
    cache, work = directory / "cache", directory / "work"
    cache.mkdir(parents=True)
    work.mkdir()
    return ImageBuilder(invoke.build_reference, server, key.public_keyring, cache, work)


def test_a_failing_compile_surfaces_its_first_error(  # noqa: PLR0917 - pytest's fixtures
    invoke: Invoke,
    build_image: subprocess.CompletedProcess[str],
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    driver_root: Path,
    tmp_path: Path,
) -> None:
    """The image's gcc-14 compiles the tarball's tree until NVIDIA's nv.c, broken here."""
    broken = tmp_path / "nv.c"
    good = driver_root / NV_C.removeprefix("/")
    broken.write_text(good.read_text() + "\n#error this driver does not build here\n")
    builder = image_builder(invoke, flatcar_release_server, flatcar_signing_key, tmp_path / "b")
    build = builder.build("open", tmp_path, mounts=((broken, f"{NV_C}:ro"),))
    line = one_line_error(build)
    assert "building the NVIDIA kernel modules failed:" in line
    assert "#error this driver does not build here" in line
    [log] = re.findall(r"\(full log: (\S+)\)", line)
    assert "this driver does not build here" in Path(log).read_text()


# --- on this machine: refusals before any compile ------------------------------------------


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
    """A PATH with every system tool but gcc: this machine has no gcc-14 anyway (Debian 12)."""
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
    """Builds on this machine, with an empty cache of its own, to see what a failure leaves."""

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
        return cache_entries(self.cache, self.work)


@pytest.fixture
def cold_builder(
    driver_root: Path,
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    tmp_path: Path,
) -> Builder:
    return Builder(driver_root, flatcar_release_server, flatcar_signing_key, tmp_path / "cache",
                   tmp_path)  # fmt: skip


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
    assert "the kernel was built with gcc 14 and no gcc 14 is available" in line
    assert "the developer container is unavailable" in line
    assert not any(entry.startswith("packages/") for entry in cold_builder.cache_entries())
