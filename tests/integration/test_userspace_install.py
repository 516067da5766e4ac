"""The project's installer on a real driver package: the fixture .run built from Debian's 535.

Installs the way the image build does (``python3 -m nvidia_driver.image.userspace install``) into a
temporary root, then checks what the GPU Operator's validator and the module build rely on:
``nvidia-smi`` and ``libnvidia-ml.so.1`` where the validator looks (reference nvidia.md 7.4),
libraries that resolve, a linker cache that knows them, and the module sources in
/usr/src/nvidia-<version>.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.runfile import build_run_fixture

pytestmark = pytest.mark.integration

VERSION = "535.261.03"
LIBDIR = "usr/lib/x86_64-linux-gnu"
ELF_MAGIC = b"\x7fELF"
# nvidia-smi's exit status when it cannot load libnvidia-ml.so.1 at all.
NVML_NOT_FOUND = 12


@dataclass(frozen=True)
class Installed:
    root: Path
    output: str


def sha256_of(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def install(runfile: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """The image build's command line, with the .run's pinned checksum."""
    return subprocess.run(
        [
            sys.executable, "-m", "nvidia_driver.image.userspace", "install",
            "--run", str(runfile), "--sha256", sha256_of(runfile),
            "--root", str(root), "--arch", "amd64",
        ],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("userspace") / "root"
    result = install(build_run_fixture(VERSION), root)
    assert result.returncode == 0, result.stderr
    yield Installed(root, result.stdout)
    shutil.rmtree(root)  # a few hundred MB: not worth keeping among pytest's base directories


def elf_files(root: Path) -> list[Path]:
    found = []
    for directory in ("usr/bin", LIBDIR):
        for path in sorted((root / directory).iterdir()):
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as stream:
                    if stream.read(4) == ELF_MAGIC:
                        found.append(path)
    return found


def with_root_libraries(root: Path) -> dict[str, str]:
    # A temporary root has no libc of its own: resolve the host's libc, the root's NVIDIA.
    return {**os.environ, "LD_LIBRARY_PATH": str(root / LIBDIR)}


def test_the_command_line_reports_each_group(installed: Installed) -> None:
    lines = installed.output.splitlines()
    assert lines[0] == f"Unpacking NVIDIA-Linux-x86_64-{VERSION}.run..."
    assert f"Installed kernel module sources in /usr/src/nvidia-{VERSION}: " in installed.output
    for group in ("NVML and tools", "CUDA", "CUDA MPS", "OpenCL", "GSP firmware"):
        assert any(line.startswith(f"Installed {group}: ") for line in lines), group


def test_nvml_and_nvidia_smi_are_where_the_validator_looks(installed: Installed) -> None:
    nvml = installed.root / LIBDIR / "libnvidia-ml.so.1"
    assert nvml.is_symlink()
    assert nvml.readlink() == Path(f"libnvidia-ml.so.{VERSION}")
    assert nvml.read_bytes()[:4] == ELF_MAGIC
    smi = installed.root / "usr/bin/nvidia-smi"
    assert stat.S_IMODE(smi.stat().st_mode) == 0o755


def test_every_installed_binary_and_library_resolves(installed: Installed) -> None:
    elves = elf_files(installed.root)
    assert {path.name for path in elves} >= {
        "nvidia-smi", "nvidia-persistenced", "nvidia-modprobe", "nvidia-debugdump",
        "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
        f"libnvidia-ml.so.{VERSION}", f"libcuda.so.{VERSION}", f"libnvidia-opencl.so.{VERSION}",
    }  # fmt: skip
    for path in elves:
        result = subprocess.run(
            ["ldd", path],
            env=with_root_libraries(installed.root),
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"{path}: {result.stderr}"
        assert "not found" not in result.stdout, f"{path}:\n{result.stdout}"


def test_nvidia_smi_loads_the_installed_nvml(installed: Installed) -> None:
    # No GPU here: nvidia-smi gets as far as talking to the driver, which it could not do
    # without loading libnvidia-ml.so.1 from the root.
    result = subprocess.run(
        [installed.root / "usr/bin/nvidia-smi"],
        env=with_root_libraries(installed.root),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode != NVML_NOT_FOUND, result.stdout
    assert "couldn't find libnvidia-ml.so" not in result.stdout


def test_the_linker_cache_of_the_root_knows_the_libraries(installed: Installed) -> None:
    assert (installed.root / "etc/ld.so.cache").is_file()
    listing = subprocess.run(
        ["ldconfig", "-r", installed.root, "-p"], capture_output=True, text=True, check=True
    ).stdout
    for soname in ("libnvidia-ml.so.1", "libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"):
        assert f"{soname} (libc6,x86-64) => /{LIBDIR}/{soname}" in listing, listing


def test_nvidia_modprobe_keeps_its_setuid_bit(installed: Installed) -> None:
    mode = (installed.root / "usr/bin/nvidia-modprobe").stat().st_mode
    assert stat.S_IMODE(mode) == 0o4755


def test_the_opencl_vendor_file_names_the_installed_library(installed: Installed) -> None:
    icd = installed.root / "etc/OpenCL/vendors/nvidia.icd"
    assert icd.read_text().strip() == "libnvidia-opencl.so.1"
    assert (installed.root / LIBDIR / "libnvidia-opencl.so.1").resolve().is_file()


def test_the_gsp_firmware_is_under_the_exact_version(installed: Installed) -> None:
    firmware = installed.root / "opt/lib/firmware/nvidia" / VERSION
    names = sorted(path.name for path in firmware.iterdir())
    assert names == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert all((firmware / name).stat().st_size > 1_000_000 for name in names)


def test_the_module_sources_are_kept_with_a_trimmed_manifest(installed: Installed) -> None:
    sources = installed.root / f"usr/src/nvidia-{VERSION}"
    for flavour in ("kernel", "kernel-open"):
        assert (sources / flavour / "Kbuild").is_file()
        assert (sources / flavour / "nvidia" / "nv-kernel.o_binary").is_file()
    assert (sources / "LICENSE").is_file()
    lines = (sources / ".manifest").read_text().splitlines()
    assert lines[1] == VERSION
    entries = lines[8:]
    assert entries
    assert all(line.startswith(("kernel", "LICENSE")) for line in entries)
    for line in entries:
        assert (sources / line.split()[0]).is_file(), line


def test_nothing_for_x11_or_the_installer_is_installed(installed: Installed) -> None:
    names = {path.name for path in installed.root.rglob("*") if "usr/src" not in path.as_posix()}
    assert not names & {"nvidia-installer", "nvidia-uninstall", "nvidia-drm_gbm.so"}
    assert not [name for name in names if "application-profiles" in name]
    assert not [name for name in names if name.endswith((".nvidia-staged", ".nvidia-replaced"))]


def test_the_xz_package_installs_the_same_tree(
    installed: Installed, xz_runfile: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("userspace-xz") / "root"
    result = install(xz_runfile, root)
    assert result.returncode == 0, result.stderr
    try:
        assert tree_listing(root) == tree_listing(installed.root)
    finally:
        shutil.rmtree(root)


def tree_listing(root: Path) -> dict[str, tuple[int, str]]:
    """Path -> (mode, link target or content digest); the linker cache is left out."""
    listing = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if relative == "etc/ld.so.cache":
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            listing[relative] = (mode, str(path.readlink()))
        elif path.is_file():
            listing[relative] = (mode, sha256_of(path))
        else:
            listing[relative] = (mode, "")
    return listing
