"""driver-root.toml and its checks: every toolkit name accounted for, the root verified."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.image import driverroot
from nvidia_driver.image.driverroot import (
    EXCLUDED,
    OPTIONAL,
    REQUIRED,
    exclusion,
    rules,
    verify_root,
)
from nvidia_driver.image.selection import GROUPS
from nvidia_driver.naming import TRIPLETS

LIBDIR = PurePosixPath("/usr/lib/x86_64-linux-gnu")

# NVIDIA/libnvidia-container src/nvc_info.c @ 00b4b47e2a3e, list by list (".so" dropped).
NVC_INFO_LISTS = {
    "utility_bins": ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"],
    "compute_bins": ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"],
    "utility_libs": ["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"],
    "compute_libs": [
        "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
        "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator",
        "libnvidia-compiler", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",
        "libnvidia-tileiras",
    ],
    "video_libs": ["libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"],
    "graphics_libs": [
        "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi",
        "libnvidia-fbc", "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix",
    ],
    "graphics_libs_glvnd": [
        "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia",
        "libnvidia-glvkspirv", "libnvidia-cbl",
    ],
    "graphics_libs_compat": ["libGL", "libEGL", "libGLESv1_CM", "libGLESv2"],
    "ngx_libs": ["libnvidia-ngx"],
    "dxcore_libs": ["libdxcore"],
}  # fmt: skip


def test_every_name_of_the_toolkit_lists_is_recorded_with_a_status() -> None:
    recorded = {(entry.toolkit_list, entry.name) for entry in rules().names}
    for toolkit_list, names in NVC_INFO_LISTS.items():
        for name in names:
            assert (toolkit_list, name) in recorded, f"{toolkit_list}: {name}"


def test_optional_and_excluded_names_say_why() -> None:
    for entry in rules().names:
        assert entry.status in {REQUIRED, OPTIONAL, EXCLUDED}
        if entry.status != REQUIRED:
            assert len(entry.reason) > 20, entry.name


def test_every_name_from_the_run_has_an_install_group() -> None:
    libraries = {name for group in GROUPS for name in group.libraries}
    files = {name for group in GROUPS for name in group.files}
    for entry in rules().names:
        if entry.origin == "run" and entry.status != EXCLUDED:
            assert entry.name in (libraries if entry.is_library else files), entry.name


def test_branches_decide_what_is_required() -> None:
    tileiras = rules().named("libnvidia-tileiras")
    gpucomp = rules().named("libnvidia-gpucomp")
    assert tileiras is not None
    assert gpucomp is not None
    assert not tileiras.required_for(580, "amd64")
    assert tileiras.required_for(590, "amd64")
    assert not gpucomp.required_for(535, "amd64")
    assert gpucomp.required_for(550, "amd64")


def test_the_pkcs11_libraries_are_required_on_amd64_only() -> None:
    # NVIDIA's aarch64 .run has no libnvidia-pkcs11*: packagers list them for x86_64 only
    # (negativo17/nvidia-driver nvidia-driver.spec, 550.54.14 to 610.43.02; openSUSE's
    # nvidia-video-G06 550.120).
    pkcs11 = rules().named("libnvidia-pkcs11-openssl3")
    assert pkcs11 is not None
    assert pkcs11.required_for(580, "amd64")
    assert not pkcs11.required_for(580, "arm64")


@pytest.mark.parametrize(
    ("name", "file_type", "arch", "why"),
    [
        ("libGL.so.1.7.0", "GLX_CLIENT_LIB", "NATIVE", "libglvnd"),
        ("nvidia_drv.so", "XMODULE_SHARED_LIB", None, "Xorg"),
        ("libcuda.so.580.1", "CUDA_LIB", "COMPAT32", "32-bit"),
        ("libnvidia-gtk3.so.580.1", "UTILITY_LIB", "NATIVE", "GTK+ 3"),
        ("libnvidia-ifr.so.1", "NVIFR_LIB_SYMLINK", "NATIVE", "495.29.05"),
        ("libGLX_indirect.so.0", "OPENGL_SYMLINK", "NATIVE", "--no-libglx-indirect"),
    ],
)
def test_exclusions_give_their_reason(
    name: str, file_type: str, arch: str | None, why: str
) -> None:
    reason = exclusion(name, file_type, arch)
    assert reason is not None
    assert why in reason


def test_a_library_the_toolkit_needs_is_never_excluded() -> None:
    assert exclusion("libcuda.so.580.1", "CUDA_LIB", "NATIVE") is None
    assert exclusion("libnvidia-fbc.so.1", "UTILITY_LIB_SYMLINK", "NATIVE") is None


# --- verify_root --------------------------------------------------------------------------------


def _root(tmp_path: Path, version: str, *, without: str = "", arch: str = "amd64") -> Path:
    """A driver root with every required name of version's branch on arch, but ``without``."""
    root = tmp_path / "root"
    libdir = root / PurePosixPath("/usr/lib", TRIPLETS[arch]).relative_to("/")
    libdir.mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc").mkdir()
    branch = int(version.split(".", 1)[0])
    for entry in rules().names:
        if not entry.required_for(branch, arch) or entry.name == without:
            continue
        if entry.is_library:
            directory = libdir / "vdpau" if entry.name == "libvdpau_nvidia" else libdir
            directory.mkdir(exist_ok=True)
            (directory / f"{entry.name}.so.{version}").write_text("lib")
            (directory / f"{entry.name}.so.1").symlink_to(f"{entry.name}.so.{version}")
        else:
            (root / "usr/bin" / entry.name).write_text("bin")
    return root


def _ldconfig(tmp_path: Path) -> Commands:
    """An ldconfig -p that lists the SONAME links the root holds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "ldconfig"
    script.write_text(
        '#!/bin/sh\necho "cache"\nfor f in "$2"/usr/lib/*-linux-gnu/*.so.1; do\n'
        '  printf "\\t%s (libc6,x86-64) => %s\\n" "$(basename "$f")" "$f"\ndone\n'
    )
    script.chmod(0o755)
    return Commands(env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_a_complete_root_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _root(tmp_path, "590.48.01")
    checked = verify_root(root, "amd64", "590.48.01", _ldconfig(tmp_path))
    assert "libnvidia-tileiras" in {entry.name for entry in checked}
    assert "names the container toolkit injects are installed" in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["libnvidia-nscq", "libnvcuvid", "nv-fabricmanager"])
def test_a_root_without_a_required_name_is_refused(tmp_path: Path, missing: str) -> None:
    root = _root(tmp_path, "580.178.04", without=missing)
    with pytest.raises(DriverError, match=rf"the driver root lacks {missing} \("):
        verify_root(root, "amd64", "580.178.04", _ldconfig(tmp_path))


def test_a_library_without_its_soname_link_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path, "580.178.04")
    (root / LIBDIR.relative_to("/") / "libnvidia-ngx.so.1").unlink()
    with pytest.raises(DriverError, match=r"libnvidia-ngx \(no SONAME link in the linker cache\)"):
        verify_root(root, "amd64", "580.178.04", _ldconfig(tmp_path))


def test_an_older_branch_does_not_need_newer_libraries(tmp_path: Path) -> None:
    root = _root(tmp_path, "535.261.03")
    assert not (root / LIBDIR.relative_to("/") / "libnvidia-gpucomp.so.535.261.03").exists()
    verify_root(root, "amd64", "535.261.03", _ldconfig(tmp_path))
    assert driverroot.missing_names(root, "amd64", 590, _ldconfig(tmp_path / "x")) == [
        f"libnvidia-gpucomp ({LIBDIR})", f"libnvidia-tileiras ({LIBDIR})"
    ]  # fmt: skip


def test_an_arm64_root_needs_no_amd64_only_library(tmp_path: Path) -> None:
    root = _root(tmp_path, "595.91.07", arch="arm64")
    arm64_libdir = root / "usr/lib/aarch64-linux-gnu"
    assert not list(arm64_libdir.glob("libnvidia-pkcs11*"))
    verify_root(root, "arm64", "595.91.07", _ldconfig(tmp_path))
