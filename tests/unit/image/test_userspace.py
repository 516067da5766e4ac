from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

import pytest
from runfile_builder import build_run
from userspace_package import (
    EXPECTED_FILES,
    HEADER,
    KERNEL_SOURCES,
    LIBDIR,
    PARTS,
    V,
    content_of,
    installed,
    make_package,
    manifest_text,
    without,
)

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.image.manifest import ManifestEntry, parse_manifest, trimmed_manifest
from nvidia_driver.image.selection import Layout, plan
from nvidia_driver.image.userspace import install_runfile, install_tree, main

HEADER_TEXT = "".join(f"{line}\n" for line in HEADER)


@pytest.fixture
def ldconfig_log(tmp_path: Path) -> Path:
    return tmp_path / "ldconfig.log"


def stub_commands(bin_dir: Path, log: Path, exit_code: int = 0) -> Commands:
    """Real tools on PATH, but an ldconfig that records its arguments (-r chroots: root only)."""
    bin_dir.mkdir(exist_ok=True)
    ldconfig = bin_dir / "ldconfig"
    ldconfig.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\n'
        + (f'echo "ldconfig: stub failure" >&2\nexit {exit_code}\n' if exit_code else "")
    )
    ldconfig.chmod(0o755)
    return Commands(env={"PATH": f"{bin_dir}:{os.environ.get('PATH', os.defpath)}"})


@pytest.fixture
def commands(tmp_path: Path, ldconfig_log: Path) -> Commands:
    return stub_commands(tmp_path / "bin", ldconfig_log)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    return make_package(tmp_path / "package")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


def entry(line: str) -> ManifestEntry:
    (parsed,) = parse_manifest(HEADER_TEXT + line + "\n").entries
    return parsed


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".nvidia-staged", ".nvidia-replaced"))]


# --- .manifest parsing -------------------------------------------------------------------------

# Verbatim 390.48 lines (reference section 3.4), each with what it must parse to: its file,
# mode, type, arch, path, inherited directory, symlink target and module tag.
VERBATIM_390 = {
    "kernel/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:resman":
        ("kernel/nvidia/nv.c", 0o644, "KERNEL_MODULE_SRC", None, None, "nvidia", None, "resman"),
    "kernel/dkms.conf 0644 DKMS_CONF INHERIT_PATH_DEPTH:1 MODULE:resman":
        ("kernel/dkms.conf", 0o644, "DKMS_CONF", None, None, "", None, "resman"),
    "nvidia-smi 0755 UTILITY_BINARY MODULE:nvml":
        ("nvidia-smi", 0o755, "UTILITY_BINARY", None, None, None, None, "nvml"),
    "nvidia-smi.1.gz 0444 MANPAGE man1/ MODULE:nvml":
        ("nvidia-smi.1.gz", 0o444, "MANPAGE", None, "man1/", None, None, "nvml"),
    "libnvidia-ml.so.390.48 0755 CUDA_LIB NATIVE / MODULE:nvml":
        ("libnvidia-ml.so.390.48", 0o755, "CUDA_LIB", "NATIVE", "/", None, None, "nvml"),
    "libnvidia-ml.so.1 0000 CUDA_SYMLINK NATIVE / libnvidia-ml.so.390.48 MODULE:nvml":
        ("libnvidia-ml.so.1", 0, "CUDA_SYMLINK", "NATIVE", "/", None, "libnvidia-ml.so.390.48",
         "nvml"),
    "libcuda.so.390.48 0755 CUDA_LIB NATIVE / MODULE:gpgpu":
        ("libcuda.so.390.48", 0o755, "CUDA_LIB", "NATIVE", "/", None, None, "gpgpu"),
    "./32/libcuda.so.390.48 0755 CUDA_LIB COMPAT32 / MODULE:gpgpu":
        ("./32/libcuda.so.390.48", 0o755, "CUDA_LIB", "COMPAT32", "/", None, None, "gpgpu"),
    "libcuda.so.1 0000 CUDA_SYMLINK COMPAT32 / libcuda.so.390.48 MODULE:gpgpu":
        ("libcuda.so.1", 0, "CUDA_SYMLINK", "COMPAT32", "/", None, "libcuda.so.390.48", "gpgpu"),
    "libnvidia-cfg.so.390.48 0755 UTILITY_LIB NATIVE MODULE:installer":
        ("libnvidia-cfg.so.390.48", 0o755, "UTILITY_LIB", "NATIVE", None, None, None,
         "installer"),
    "libnvidia-cfg.so.1 0000 UTILITY_LIB_SYMLINK NATIVE libnvidia-cfg.so.390.48 MODULE:installer":
        ("libnvidia-cfg.so.1", 0, "UTILITY_LIB_SYMLINK", "NATIVE", None, None,
         "libnvidia-cfg.so.390.48", "installer"),
    "libnvidia-opencl.so.390.48 0755 OPENCL_LIB NATIVE / MODULE:gpgpu":
        ("libnvidia-opencl.so.390.48", 0o755, "OPENCL_LIB", "NATIVE", "/", None, None, "gpgpu"),
    "nvidia.icd 0444 CUDA_ICD MODULE:gpgpu":
        ("nvidia.icd", 0o444, "CUDA_ICD", None, None, None, None, "gpgpu"),
    "nvidia-persistenced 0755 UTILITY_BINARY MODULE:nvpd":
        ("nvidia-persistenced", 0o755, "UTILITY_BINARY", None, None, None, None, "nvpd"),
    "nvidia-cuda-mps-server 0755 UTILITY_BINARY MODULE:gpgpu":
        ("nvidia-cuda-mps-server", 0o755, "UTILITY_BINARY", None, None, None, None, "gpgpu"),
    "nvidia-modprobe 04755 NVIDIA_MODPROBE /usr/bin/ MODULE:installer":
        ("nvidia-modprobe", 0o4755, "NVIDIA_MODPROBE", None, "/usr/bin/", None, None,
         "installer"),
    "nvidia-uninstall 0000 UTILITY_BIN_SYMLINK nvidia-installer MODULE:installer":
        ("nvidia-uninstall", 0, "UTILITY_BIN_SYMLINK", None, None, None, "nvidia-installer",
         "installer"),
    "libvdpau_nvidia.so 0000 VDPAU_SYMLINK NATIVE / vdpau/libvdpau_nvidia.so.390.48 MODULE:vdpau":
        ("libvdpau_nvidia.so", 0, "VDPAU_SYMLINK", "NATIVE", "/", None,
         "vdpau/libvdpau_nvidia.so.390.48", "vdpau"),
    "html/nvidia-smi.html 0444 DOCUMENTATION NVIDIA_GLX-1.0/html MODULE:installer":
        ("html/nvidia-smi.html", 0o444, "DOCUMENTATION", None, "NVIDIA_GLX-1.0/html", None, None,
         "installer"),
    # The historical TLS class after the arch (up to 410.73).
    "tls/libnvidia-tls.so.390.48 0755 TLS_LIB NATIVE NEW tls/ MODULE:opengl":
        ("tls/libnvidia-tls.so.390.48", 0o755, "TLS_LIB", "NATIVE", "tls/", None, None, "opengl"),
    # The historical GLVND flag after the target (up to 435.17): ignored.
    "libGL.so.1 0000 GLX_CLIENT_SYMLINK NATIVE libGL.so.390.48 NON_GLVND MODULE:opengl":
        ("libGL.so.1", 0, "GLX_CLIENT_SYMLINK", "NATIVE", None, None, "libGL.so.390.48",
         "opengl"),
    # 390's VULKAN_ICD_JSON had no path field yet.
    "nvidia_icd.json.template 0644 VULKAN_ICD_JSON MODULE:opengl":
        ("nvidia_icd.json.template", 0o644, "VULKAN_ICD_JSON", None, None, None, None, "opengl"),
    "kernel/nvidia-uvm/hwref/volta/gv100/dev_mmu.h 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 "
    "MODULE:uvm":
        ("kernel/nvidia-uvm/hwref/volta/gv100/dev_mmu.h", 0o644, "KERNEL_MODULE_SRC", None, None,
         "nvidia-uvm/hwref/volta/gv100", None, "uvm"),
}  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), VERBATIM_390.items(), ids=range(len(VERBATIM_390)))
def test_every_entry_shape_parses(line: str, expected: tuple[object, ...]) -> None:
    parsed = entry(line)
    assert (
        parsed.file,
        parsed.mode,
        parsed.file_type,
        parsed.arch,
        parsed.path,
        parsed.inherited_dir,
        parsed.target,
        parsed.module,
    ) == expected
    assert parsed.line == 9


def test_systemd_unit_symlinks_point_at_the_unit_not_the_module_tag() -> None:
    # These lines have a path but no target: nvidia-installer reads MODULE: as the target and
    # then replaces it with the unit's own path.
    line = "nvidia-suspend.service 0000 SYSTEMD_UNIT_SYMLINK suspend.target.wants/ MODULE:powerd"
    parsed = entry(line)
    assert parsed.path == "suspend.target.wants/"
    assert parsed.target == "/usr/lib/systemd/system/nvidia-suspend.service"
    assert parsed.module == "powerd"


def test_the_header_gives_version_and_kernel_modules() -> None:
    manifest = parse_manifest(manifest_text())
    assert manifest.description == "NVIDIA Accelerated Graphics Driver for Linux-x86_64"
    assert manifest.version == V
    assert manifest.kernel_modules == (
        "nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem"
    )  # fmt: skip
    assert manifest.entries[0].file == f"libnvidia-ml.so.{V}"


def test_parsing_stops_at_the_first_empty_line() -> None:
    text = HEADER_TEXT + "nvidia-smi 0755 UTILITY_BINARY MODULE:nvml\n\nnot an entry at all\n"
    assert [e.file for e in parse_manifest(text).entries] == ["nvidia-smi"]


def test_unknown_types_are_skipped_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    text = HEADER_TEXT + (
        "nvidia-smi 0755 UTILITY_BINARY MODULE:nvml\n"
        "widget-a 0644 FUTURE_WIDGET_TYPE MODULE:future\n"
        "widget-b 0644 FUTURE_WIDGET_TYPE odd fields MODULE:future\n"
    )
    manifest = parse_manifest(text)
    assert [e.file for e in manifest.entries] == ["nvidia-smi"]
    assert [(u.line, u.file, u.file_type) for u in manifest.unknown] == [
        (10, "widget-a", "FUTURE_WIDGET_TYPE"),
        (11, "widget-b", "FUTURE_WIDGET_TYPE"),
    ]
    assert capsys.readouterr().out == (
        "WARNING: .manifest line 10: unknown file type FUTURE_WIDGET_TYPE; skipping 2 file(s) "
        "of that type, first widget-a\n"
    )


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("nvidia-smi 0755", "needs a file, a mode and a type"),
        ("nvidia-smi 07x5 UTILITY_BINARY MODULE:nvml", "not an octal file mode"),
        ("nvidia-smi 017777 UTILITY_BINARY MODULE:nvml", "not an octal file mode"),
        ("libcuda.so.1 0755 CUDA_LIB / MODULE:gpgpu", "CUDA_LIB needs NATIVE or COMPAT32"),
        ("libcuda.so.1 0000 CUDA_SYMLINK NATIVE / MODULE:gpgpu", "needs a symlink target"),
        ("nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:x", "does not fit"),
        ("kernel/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:x MODULE:x", "does not fit"),
        ("kernel/nv.c 0644 KERNEL_MODULE_SRC MODULE:x", "needs INHERIT_PATH_DEPTH:N"),
    ],
)
def test_malformed_entries_are_errors(line: str, why: str) -> None:
    with pytest.raises(DriverError, match=rf"line 9 is malformed \(.*{re.escape(why)}"):
        parse_manifest(HEADER_TEXT + line + "\n")


@pytest.mark.parametrize(
    "text", ["", "NVIDIA\n", "d\n\n \nnvidia\n \n \n.\n.\nx 0755 UTILITY_BINARY"]
)
def test_a_manifest_without_version_or_entries_is_refused(text: str) -> None:
    with pytest.raises(DriverError, match="no version or no entries"):
        parse_manifest(text)


def test_the_trimmed_manifest_keeps_the_header_and_kernel_and_license_lines() -> None:
    trimmed = trimmed_manifest(manifest_text()).splitlines()
    assert trimmed[:8] == list(HEADER)
    assert trimmed[8:] == [
        part.line for part in PARTS if part.path.startswith(("kernel", "LICENSE"))
    ]
    assert trimmed[8].startswith("LICENSE 0644 DOCUMENTATION")


# --- selection ---------------------------------------------------------------------------------


def test_the_plan_places_by_type(capsys: pytest.CaptureFixture[str]) -> None:
    planned = plan(parse_manifest(manifest_text()), Layout("x86_64-linux-gnu", V))
    destinations = {str(item.destination).lstrip("/") for item in planned}
    assert destinations == set(EXPECTED_FILES)
    groups = {item.entry.name: item.group for item in planned}
    assert groups["libcuda.so.1"] == "CUDA"
    assert groups["nvidia-smi"] == "NVML and tools"
    assert groups["gsp_ga10x.bin"] == "GSP firmware"
    assert groups["nvidia-modprobe.1.gz"] == "man pages"
    assert "nvidia-settings.1.gz" not in groups  # only the pages of programs we install
    assert "skipping the duplicate" not in capsys.readouterr().out  # the 32-bit link is not one


def test_duplicate_destinations_keep_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    text = manifest_text() + "libcuda.so.1 0000 CUDA_SYMLINK NATIVE / libcuda.so.other MODULE:x\n"
    planned = plan(parse_manifest(text), Layout("x86_64-linux-gnu", V))
    (link,) = [item for item in planned if item.entry.name == "libcuda.so.1"]
    assert link.entry.target == f"libcuda.so.{V}"
    assert "is already installed from line" in capsys.readouterr().out


def test_a_selected_file_of_an_unplaceable_type_stops_the_install() -> None:
    text = manifest_text() + "nvidia-debugdump 0755 DOCUMENTATION NVIDIA_GLX-1.0 MODULE:x\n"
    with pytest.raises(DriverError, match=r"lists nvidia-debugdump \(DOCUMENTATION, line \d+\)"):
        plan(parse_manifest(text), Layout("x86_64-linux-gnu", V))


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-future-widget 0644 FUTURE_WIDGET_TYPE MODULE:future",
        f"libnvidia-future.so.{V} 0755 CUDA_LIB NATIVE / MODULE:gpgpu",
        "nvidia-future-tool 0755 UTILITY_BINARY MODULE:future",
    ],
    ids=["unknown-type", "new-library", "new-binary"],
)
def test_a_file_nothing_claims_or_excludes_stops_the_install(
    line: str, root: Path, tmp_path: Path, commands: Commands
) -> None:
    """A new NVIDIA release must not lose a file unnoticed: the install names it."""
    package = make_package(tmp_path / "package", manifest=manifest_text() + line + "\n")
    name = line.split(maxsplit=1)[0]
    with pytest.raises(DriverError, match=rf"lists {re.escape(name)} \(.*which no install group"):
        install_tree(package, root, arch="amd64", commands=commands)
    assert not any(root.iterdir())


def test_excluded_files_are_accounted_for_by_type_name_or_arch() -> None:
    planned = plan(parse_manifest(manifest_text()), Layout("x86_64-linux-gnu", V))
    names = {item.entry.file for item in planned}
    # X11, installer, 32-bit, Wayland, systemd and docs entries are in PARTS and left out.
    assert not names & {
        "nvidia_drv.so", "nvidia-installer", f"32/libcuda.so.{V}", "10_nvidia_wayland.json",
        "systemd/system/nvidia-suspend.service", "html/index.html", f"libnvidia-gtk3.so.{V}",
    }  # fmt: skip


@pytest.mark.parametrize("missing", ["nvidia-smi", f"libnvidia-ml.so.{V}", f"libcuda.so.{V}"])
def test_a_package_without_the_essentials_is_refused(missing: str) -> None:
    manifest = parse_manifest(manifest_text(without(missing)))
    name = missing.removesuffix(f".so.{V}")
    with pytest.raises(DriverError, match=rf"\.manifest lists no {name}:"):
        plan(manifest, Layout("x86_64-linux-gnu", V))


@pytest.mark.parametrize(
    ("replaced", "line"),
    [
        ("nvidia-smi", "../nvidia-smi 0755 UTILITY_BINARY MODULE:nvml"),
        ("nvidia-smi.1.gz", "nvidia-smi.1.gz 0444 MANPAGE ../../../etc/ MODULE:nvml"),
        ("nvidia-modprobe", "nvidia-modprobe 04755 NVIDIA_MODPROBE /usr/../../tmp/ MODULE:x"),
    ],
)
def test_paths_leading_out_of_their_directory_are_refused(
    replaced: str, line: str, root: Path, tmp_path: Path, commands: Commands
) -> None:
    package = make_package(tmp_path / "package", manifest=manifest_text(without(replaced)) + line)
    with pytest.raises(DriverError, match="points outside its directory"):
        install_tree(package, root, arch="amd64", commands=commands)
    assert not any(root.iterdir())


# --- installing --------------------------------------------------------------------------------


def test_install_lays_out_a_headless_node(
    package: Path, root: Path, commands: Commands, ldconfig_log: Path
) -> None:
    result = install_tree(package, root, arch="amd64", commands=commands)
    assert installed(root) == EXPECTED_FILES
    assert stat.S_IMODE((root / "usr/bin/nvidia-modprobe").stat().st_mode) == 0o4755
    assert (root / "usr/bin/nvidia-smi").read_bytes() == content_of("nvidia-smi")
    assert (root / LIBDIR / "libnvidia-ml.so.1").read_bytes() == content_of(f"libnvidia-ml.so.{V}")
    assert ldconfig_log.read_text() == f"-r {root}\n"
    assert result.version == V
    assert not leftovers(root)


def test_install_reports_one_line_per_group(
    package: Path, root: Path, commands: Commands, capsys: pytest.CaptureFixture[str]
) -> None:
    install_tree(package, root, arch="amd64", commands=commands)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Installing the NVIDIA {V} userspace into {root}..."
    assert [line.split(":")[0] for line in lines[1:]] == [
        "Installed NVML and tools",
        "Installed CUDA",
        "Installed CUDA MPS",
        "Installed OpenCL",
        "Installed Video (NVDEC, NVENC, optical flow, VDPAU)",
        "Installed Graphics (EGL, GLX, GLES, Vulkan, OptiX, NvFBC)",
        "Installed nvidia-modprobe",
        "Installed GSP firmware",
        "Installed man pages",
        f"Installed kernel module sources in /usr/src/nvidia-{V}",
    ]
    assert lines[1] == (
        f"Installed NVML and tools: libnvidia-ml.so.{V}, libnvidia-cfg.so.{V}, nvidia-smi, "
        "nvidia-debugdump, nvidia-persistenced (+3 symlinks)"
    )


def test_install_keeps_the_kernel_module_sources(
    package: Path, root: Path, commands: Commands
) -> None:
    install_tree(package, root, arch="amd64", commands=commands)
    sources = root / f"usr/src/nvidia-{V}"
    found = {p.relative_to(sources).as_posix() for p in sources.rglob("*") if p.is_file()}
    assert found == KERNEL_SOURCES | {"LICENSE", ".manifest"}
    assert (sources / ".manifest").read_text() == trimmed_manifest(manifest_text())
    assert (sources / "kernel/nvidia/nv.c").read_bytes() == content_of("kernel/nvidia/nv.c")
    assert stat.S_IMODE((sources / "kernel/conftest.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE(sources.stat().st_mode) == 0o755


def test_the_firmware_goes_under_its_exact_version_in_opt(
    package: Path, root: Path, commands: Commands
) -> None:
    install_tree(package, root, arch="amd64", commands=commands)
    firmware = root / "opt/lib/firmware/nvidia" / V
    assert sorted(p.name for p in firmware.iterdir()) == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    # The Operator mounts a host path over /lib/firmware: whatever the image puts there is hidden.
    assert not (root / "lib/firmware").exists()


def test_arm64_libraries_go_to_the_aarch64_triplet(
    package: Path, root: Path, commands: Commands
) -> None:
    install_tree(package, root, arch="arm64", commands=commands)
    assert (root / "usr/lib/aarch64-linux-gnu" / f"libcuda.so.{V}").is_file()
    assert not (root / LIBDIR).exists()


def test_the_aarch64_cuda_extension_library_is_installed_with_libcuda() -> None:
    # The aarch64 .run ships libnvcuextend from 610 (negativo17/nvidia-driver nvidia-driver.spec
    # 610.43.02, %ifarch aarch64, beside libcuda); libcuda dlopens it at cuInit.
    text = manifest_text() + (
        f"libnvcuextend.so.{V} 0755 CUDA_LIB NATIVE / MODULE:gpgpu\n"
        f"libnvcuextend.so.1 0000 CUDA_SYMLINK NATIVE / libnvcuextend.so.{V} MODULE:gpgpu\n"
    )
    planned = plan(parse_manifest(text), Layout("aarch64-linux-gnu", V))
    groups = {str(item.destination): item.group for item in planned}
    assert groups[f"/usr/lib/aarch64-linux-gnu/libnvcuextend.so.{V}"] == "CUDA"
    assert groups["/usr/lib/aarch64-linux-gnu/libnvcuextend.so.1"] == "CUDA"


def test_man_pages_are_optional(package: Path, root: Path, commands: Commands) -> None:
    install_tree(package, root, arch="amd64", commands=commands, man_pages=False)
    assert not (root / "usr/share/man").exists()


def test_installing_twice_replaces_in_place(package: Path, root: Path, commands: Commands) -> None:
    install_tree(package, root, arch="amd64", commands=commands)
    (root / "usr/bin/nvidia-smi").write_text("old\n")
    (root / f"usr/src/nvidia-{V}/stale-file").write_text("old\n")
    install_tree(package, root, arch="amd64", commands=commands)
    assert (root / "usr/bin/nvidia-smi").read_bytes() == content_of("nvidia-smi")
    assert not (root / f"usr/src/nvidia-{V}/stale-file").exists()
    assert installed(root) == EXPECTED_FILES
    assert not leftovers(root)


def test_a_failure_before_the_commit_installs_nothing(
    package: Path, root: Path, commands: Commands, ldconfig_log: Path
) -> None:
    (root / "usr").mkdir()
    (root / "usr/src").write_text("a file where a directory must go\n")
    with pytest.raises(DriverError, match="nothing was installed"):
        install_tree(package, root, arch="amd64", commands=commands)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["usr", "usr/src"]
    assert not ldconfig_log.exists()


def test_a_failure_after_the_commit_restores_what_was_there(
    package: Path, root: Path, tmp_path: Path, ldconfig_log: Path
) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("the old nvidia-smi\n")
    (root / f"usr/src/nvidia-{V}").mkdir(parents=True)
    (root / f"usr/src/nvidia-{V}/old").write_text("old sources\n")
    failing = stub_commands(tmp_path / "failing-bin", ldconfig_log, exit_code=1)
    with pytest.raises(
        DriverError, match=r"\(ldconfig failed \(exit 1\): ldconfig: stub failure\)"
    ):
        install_tree(package, root, arch="amd64", commands=failing)
    assert ldconfig_log.read_text() == f"-r {root}\n"  # it ran after the files were in place
    assert (root / "usr/bin/nvidia-smi").read_text() == "the old nvidia-smi\n"
    assert [p.name for p in (root / f"usr/src/nvidia-{V}").iterdir()] == ["old"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "usr", "usr/bin", "usr/bin/nvidia-smi", "usr/src", f"usr/src/nvidia-{V}",
        f"usr/src/nvidia-{V}/old",
    ]  # fmt: skip


def test_an_unknown_architecture_is_refused(package: Path, root: Path, commands: Commands) -> None:
    with pytest.raises(DriverError, match="unknown architecture 'riscv64'"):
        install_tree(package, root, arch="riscv64", commands=commands)


def test_a_listed_file_missing_from_the_package_is_an_error(
    root: Path, tmp_path: Path, commands: Commands
) -> None:
    package = make_package(tmp_path / "package")
    (package / f"libcuda.so.{V}").unlink()
    with pytest.raises(DriverError, match=f"lists libcuda.so.{V}, which the package does not"):
        install_tree(package, root, arch="amd64", commands=commands)
    assert not any(root.iterdir())


def test_a_package_without_module_sources_is_refused(
    root: Path, tmp_path: Path, commands: Commands
) -> None:
    parts = tuple(p for p in PARTS if not p.path.startswith("kernel"))
    package = make_package(tmp_path / "package", parts)
    with pytest.raises(DriverError, match="neither kernel/ nor kernel-open/"):
        install_tree(package, root, arch="amd64", commands=commands)


def test_a_package_without_a_manifest_is_refused(
    root: Path, tmp_path: Path, commands: Commands
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DriverError, match=r"no readable \.manifest"):
        install_tree(tmp_path / "empty", root, arch="amd64", commands=commands)


# --- from a .run, and the command line -----------------------------------------------------------


def test_install_runfile_verifies_unpacks_and_installs(
    package: Path, root: Path, tmp_path: Path, commands: Commands
) -> None:
    built = build_run(tmp_path / f"NVIDIA-Linux-x86_64-{V}.run", package, "xz", version=V)
    digest = hashlib.sha256(built.path.read_bytes()).hexdigest()
    result = install_runfile(built.path, root, arch="amd64", sha256=digest, commands=commands)
    assert result.version == V
    assert installed(root) == EXPECTED_FILES
    # The .run's tar drops setuid; the manifest's mode puts it back.
    assert stat.S_IMODE((root / "usr/bin/nvidia-modprobe").stat().st_mode) == 0o4755


def test_install_runfile_refuses_another_architecture(
    package: Path, root: Path, tmp_path: Path, commands: Commands
) -> None:
    built = build_run(tmp_path / "x.run", package, "gzip", arch="aarch64")
    with pytest.raises(DriverError, match=r"is for aarch64, not x86_64 \(amd64\)"):
        install_runfile(built.path, root, arch="amd64", commands=commands)
    assert not any(root.iterdir())


def test_the_command_line_installs_and_prints_one_line_per_group(
    package: Path,
    root: Path,
    *,
    tmp_path: Path,
    commands: Commands,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PATH", commands.env["PATH"])
    built = build_run(tmp_path / "x.run", package, "gzip", version=V)
    digest = hashlib.sha256(built.path.read_bytes()).hexdigest()
    argv = ["install", "--run", str(built.path), "--sha256", digest, "--root", str(root)]
    assert main([*argv, "--arch", "amd64", "--no-man-pages"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Unpacking x.run..."
    assert sum(line.startswith("Installed ") for line in out) == 9  # no man pages
    assert installed(root) == {
        path: mode for path, mode in EXPECTED_FILES.items() if "/man/" not in path
    }


def test_the_command_line_reports_a_failure_in_one_line(
    package: Path,
    root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    built = build_run(tmp_path / "x.run", package, "gzip")
    argv = ["install", "--run", str(built.path), "--sha256", "0" * 64, "--root", str(root)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ")
    assert err.count("\n") == 1
    assert "SHA-256" in err
    assert not any(root.iterdir())


def test_the_command_line_requires_a_run_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["install"])
    assert "--run" in capsys.readouterr().err


def test_only_nvidia_modprobe_may_be_setuid(
    tmp_path: Path, root: Path, commands: Commands, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = manifest_text().replace(
        "nvidia-smi 0755 UTILITY_BINARY", "nvidia-smi 06755 UTILITY_BINARY"
    )
    assert "nvidia-smi 06755" in manifest
    package = make_package(tmp_path / "package", manifest=manifest)
    install_tree(package, root, arch="amd64", commands=commands)
    assert stat.S_IMODE((root / "usr/bin/nvidia-smi").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "usr/bin/nvidia-modprobe").stat().st_mode) == 0o4755
    assert "nvidia-smi asks for mode 6755; only nvidia-modprobe may be setuid" in (
        capsys.readouterr().out
    )
