"""The arm64 driver userspace: the project's installer on an aarch64 .run, into an arm64 root.

``NVIDIA-Linux-aarch64-550.163.01.run`` is the fixture made from Debian trixie's arm64 NVIDIA
packages (fixtures/runfile_arm64.py). The root first gets the arm64 Debian libraries an image
has for NVIDIA's programs and libraries (glibc, libgcc, libX11, libXext, libtirpc and what they
depend on), then ``python3 -m nvidia_driver.image.userspace install --arch arm64`` installs the
.run into it, from its manifest, as the image build does, and then the redist archives NVIDIA
publishes for arm64 under its ``sbsa`` platform name
(``fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-<v>-archive.tar.xz``; fixtures/
driver_server.py's layouts with aarch64 stand-ins), chosen from redistrib_<v>.json and installed
by the image build's own step (image/provision.py's install_redist). No Docker: this runs on
this amd64 machine.

Checked: every ELF the installer wrote is aarch64 (the GSP firmware is RISC-V code for the GPU,
and said so); every DT_NEEDED of every program and library, and every program's loader, is in
the root (a static check, as the dynamic loader would search it); and nvidia-smi, run under
qemu-user (``qemu-aarch64-static``, no binfmt_misc needed), loads the installed NVML and gets as
far as looking for the driver.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.cross_build import ARM64_DRIVER
from fixtures.debian import ensure_packages
from fixtures.debian_arm64 import download_arm64, versions, with_dependencies
from fixtures.driver_server import COMPONENTS, compile_stand_ins, redist_archive, redistrib_manifest
from fixtures.kernel_headers import unpack
from fixtures.runfile_arm64 import build_arm64_run_fixture

from nvidia_driver.formats.elf import read_elf
from nvidia_driver.image.provision import install_redist

pytestmark = [pytest.mark.integration, pytest.mark.arm64]

VERSION = ARM64_DRIVER  # the version the arm64 session warms up (fixtures/warmup.py)
LIBDIR = "usr/lib/aarch64-linux-gnu"
EM_AARCH64 = 183
EM_RISCV = 243  # the GSP firmware runs on the GPU's RISC-V core
# What the dynamic loader of an arm64 Debian (or Flatcar) root searches, /usr merged.
SEARCH_DIRS = (LIBDIR, "usr/lib", "lib/aarch64-linux-gnu", "lib")
# The Debian libraries NVIDIA's arm64 userspace links beyond its own (the build image installs
# them on both arches: images/build/Dockerfile), with their dependencies.
ROOT_LIBRARIES = ("libc6", "libgcc-s1", "libx11-6", "libxext6", "libtirpc3t64", "libibumad3")
SBSA = "linux-sbsa"
# NVIDIA publishes no arm64 NVSDM (its ubuntu24.04/install.sh: "libnvsdm packages are not
# available for arm64"): the arm64 redist has the others.
ARM64_COMPONENTS = [component for component in COMPONENTS if component != "libnvsdm"]
# nvidia-smi's exit status when it finds NVML but no driver, and when it finds no NVML.
NO_DRIVER = 9
NVML_NOT_FOUND = 12


@dataclass(frozen=True)
class Installed:
    root: Path
    output: str
    written: list[Path]  # what the installers added to the root
    redist: dict[str, str]  # component -> the relative path redistrib_<v>.json lists


def _arm64_base_root(root: Path) -> None:
    """A merged-/usr root with the arm64 Debian libraries in it."""
    for link, target in (("lib", "usr/lib"), ("bin", "usr/bin"), ("sbin", "usr/sbin")):
        (root / target).mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    names = with_dependencies(ROOT_LIBRARIES)
    for deb in download_arm64(versions(names)).values():
        shutil.copytree(unpack(deb), root, symlinks=True, dirs_exist_ok=True)


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file() and not path.is_symlink()}


@pytest.fixture(scope="module")
def arm64_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    runfile = build_arm64_run_fixture(VERSION)
    root = tmp_path_factory.mktemp("arm64-userspace") / "root"
    root.mkdir()
    _arm64_base_root(root)
    before = _files(root)
    with runfile.open("rb") as stream:
        pinned = hashlib.file_digest(stream, "sha256").hexdigest()
    result = subprocess.run(
        [
            sys.executable, "-m", "nvidia_driver.image.userspace", "install",
            "--run", str(runfile), "--sha256", pinned,
            "--root", str(root), "--arch", "arm64",
        ],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    redist = _install_sbsa_redist(root, tmp_path_factory.mktemp("redist"))
    written = sorted(_files(root) - before)
    yield Installed(root, result.stdout, written, redist)
    shutil.rmtree(root)


def _install_sbsa_redist(root: Path, downloads: Path) -> dict[str, str]:
    """The arm64 archives, served from a directory, installed as the image build installs them
    (image/provision.py's install_redist: redistrib_<v>.json, recorded digests, NVLSM's linker
    config)."""
    built = compile_stand_ins(VERSION, "arm64")
    archives = {}
    for component in ARM64_COMPONENTS:
        component_version = COMPONENTS[component][1] or VERSION
        relative, data = redist_archive(component, component_version, built, SBSA)
        archives[component] = (component_version, relative, data)
        (downloads / relative).parent.mkdir(parents=True, exist_ok=True)
        (downloads / relative).write_bytes(data)
    manifest = redistrib_manifest(VERSION, archives, SBSA)
    (downloads / f"redistrib_{VERSION}.json").write_bytes(manifest)
    recorded = ",".join(f"{c}.arm64={hashlib.sha256(data).hexdigest()}" for c, (_, _, data) in
                        archives.items())  # fmt: skip
    installed = install_redist(base_url=downloads.as_uri(), version=VERSION, arch="arm64",
                               sha256_spec=recorded, root=root)  # fmt: skip
    assert [archive.component.key for archive in installed] == ARM64_COMPONENTS
    return {archive.component.key: archive.relative_path for archive in installed}


def test_the_redist_archives_are_nvidias_sbsa_ones(arm64_installed: Installed) -> None:
    fabricmanager = f"fabricmanager/{SBSA}/fabricmanager-{SBSA}-{VERSION}-archive.tar.xz"
    assert arm64_installed.redist["fabricmanager"] == fabricmanager
    for component, relative in arm64_installed.redist.items():
        assert relative.startswith(f"{component}/{SBSA}/{component}-{SBSA}-"), relative
    for program in (
        "usr/bin/nv-fabricmanager",
        "usr/bin/nvidia-imex",
        "opt/nvidia/nvlsm/sbin/nvlsm",
    ):
        assert (arm64_installed.root / program).is_file(), program
    assert (arm64_installed.root / LIBDIR / f"libnvidia-nscq.so.{VERSION}").is_file()


def _elves(paths: list[Path]) -> dict[Path, int]:
    found = {}
    for path in paths:
        with path.open("rb") as stream:
            header = stream.read(20)
        if header[:4] == b"\x7fELF":
            found[path] = int.from_bytes(header[18:20], "little")
    return found


def test_the_aarch64_run_is_installed_from_its_manifest(arm64_installed: Installed) -> None:
    lines = arm64_installed.output.splitlines()
    assert lines[0] == f"Unpacking NVIDIA-Linux-aarch64-{VERSION}.run..."
    for group in ("NVML and tools", "CUDA", "CUDA MPS", "OpenCL", "GSP firmware"):
        assert any(line.startswith(f"Installed {group}: ") for line in lines), group
    nvml = arm64_installed.root / LIBDIR / "libnvidia-ml.so.1"
    assert nvml.readlink() == Path(f"libnvidia-ml.so.{VERSION}")
    assert (arm64_installed.root / f"usr/src/nvidia-{VERSION}/kernel-open/Kbuild").is_file()


def test_every_installed_elf_is_aarch64(arm64_installed: Installed) -> None:
    elves = _elves([path for path in arm64_installed.written if "usr/src" not in path.as_posix()])
    names = {path.name for path in elves}
    assert {"nvidia-smi", "nvidia-persistenced", f"libcuda.so.{VERSION}",
            f"libnvidia-ml.so.{VERSION}", "nv-fabricmanager", "nvlsm"} <= names  # fmt: skip
    firmware = {path for path in elves if "/firmware/nvidia/" in path.as_posix()}
    assert {elves[path] for path in firmware} == {EM_RISCV}
    wrong = {path.name: machine for path, machine in elves.items()
             if path not in firmware and machine != EM_AARCH64}  # fmt: skip
    assert not wrong
    # The closed cores of the module sources are NVIDIA's aarch64 objects too.
    for flavour in ("kernel", "kernel-open"):
        core = (
            arm64_installed.root / f"usr/src/nvidia-{VERSION}/{flavour}/nvidia/nv-kernel.o_binary"
        )
        assert _elves([core]) == {core: EM_AARCH64}


def _search_dirs(root: Path) -> list[str]:
    """The default directories, then those the root's ld.so.conf.d adds (NVLSM's lib/)."""
    configured = [
        line.strip().lstrip("/")
        for conf in sorted((root / "etc/ld.so.conf.d").glob("*.conf"))
        for line in conf.read_text().splitlines()
        if line.strip().startswith("/")
    ]
    return [*SEARCH_DIRS, *configured]


def _find(root: Path, name: str) -> Path | None:
    for directory in _search_dirs(root):
        candidate = root / directory / name
        if candidate.exists():  # follows links, within the root: they are relative or /usr-merged
            return candidate
    return None


def test_every_needed_library_and_loader_is_in_the_root(arm64_installed: Installed) -> None:
    """DT_NEEDED of every installed program and library, read by the project's ELF reader."""
    missing: dict[str, list[str]] = {}
    checked = 0
    for path in arm64_installed.written:
        if "usr/src" in path.as_posix() or "/firmware/" in path.as_posix():
            continue
        info = read_elf(path)
        if info is None:
            continue
        checked += 1
        if info.interpreter is not None:
            loader = arm64_installed.root / info.interpreter.lstrip("/")
            if not loader.exists():
                missing.setdefault(info.interpreter, []).append(path.name)
        for name in info.needed:
            if _find(arm64_installed.root, name) is None:
                missing.setdefault(name, []).append(path.name)
    assert checked >= 30
    assert not missing


def test_nvidia_smi_loads_the_installed_nvml_under_qemu_user(arm64_installed: Installed) -> None:
    ensure_packages(["qemu-user-static"])
    result = subprocess.run(
        ["qemu-aarch64-static", "-L", str(arm64_installed.root),
         "-E", f"LD_LIBRARY_PATH=/{LIBDIR}", str(arm64_installed.root / "usr/bin/nvidia-smi")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == NO_DRIVER, output
    assert result.returncode != NVML_NOT_FOUND
    assert "couldn't communicate with the NVIDIA driver" in output
