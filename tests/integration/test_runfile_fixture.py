"""The fixture .run built from Debian's packages is in NVIDIA's format, and self-consistent.

These tests are what lets the project's installer tests trust the fixture: the stub extracts it
as NVIDIA's does (``sh X.run -x --target DIR``), the header's CRC and MD5 hold over line 4 to EOF,
``skip`` points at the compressed tar, and the .manifest lists exactly the files in the tree.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.runfile import (
    FORMAT_REVISION,
    RELEASE_SUITES,
    build_run_fixture,
    header_keys,
    manifest_mode,
    payload_offset,
)

from nvidia_driver.image.runfile import PosixCksum

pytestmark = pytest.mark.integration

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"
# What the stub runs besides shell built-ins; zstd is left out on purpose.
STUB_TOOLS = ("tail", "head", "cksum", "md5sum", "mktemp", "chmod", "mkdir", "tar")
SYMLINK_TYPES = {
    "CUDA_SYMLINK",
    "OPENCL_LIB_SYMLINK",
    "UTILITY_LIB_SYMLINK",
    "GBM_BACKEND_LIB_SYMLINK",
    "UTILITY_BIN_SYMLINK",
    "NVCUVID_LIB_SYMLINK",
    "ENCODEAPI_LIB_SYMLINK",
    "VDPAU_SYMLINK",
    "OPENGL_SYMLINK",
}


@dataclass(frozen=True)
class Extracted:
    version: str
    runfile: Path
    tree: Path


@pytest.fixture(scope="session", params=sorted(RELEASE_SUITES))
def extracted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Extracted]:
    """Each driver version's fixture .run, extracted by running its own stub."""
    version: str = request.param
    runfile = build_run_fixture(version)
    tree = tmp_path_factory.mktemp(f"run-{version}") / "tree"
    result = sh(runfile, "-x", "--target", tree)
    assert result.returncode == 0, result.stderr
    yield Extracted(version, runfile, tree)
    # Half a gigabyte per version: not worth keeping in pytest's last three base directories.
    shutil.rmtree(tree)


def sh(runfile: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", runfile, *map(str, args)], capture_output=True, text=True, check=False, timeout=600
    )


@dataclass(frozen=True)
class Entry:
    path: str
    mode: str
    file_type: str
    fields: list[str]
    module: str


def manifest_entries(tree: Path) -> list[Entry]:
    entries = []
    for line in (tree / ".manifest").read_text().splitlines()[8:]:
        words = line.split()
        assert words[-1].startswith("MODULE:"), line
        entries.append(Entry(words[0], words[1], words[2], words[3:-1], words[-1]))
    return entries


def files_in(tree: Path) -> set[str]:
    return {
        path.relative_to(tree).as_posix()
        for path in tree.rglob("*")
        if not path.is_dir() and path.name != ".manifest"
    }


# --- the container ---------------------------------------------------------------------------


def test_stub_extracts_the_tree_into_the_target(extracted: Extracted) -> None:
    tree = extracted.tree
    version = extracted.version
    for expected in (
        ".manifest",
        "nvidia-smi",
        f"libcuda.so.{version}",
        f"libnvidia-ml.so.{version}",
        "firmware/gsp_ga10x.bin",
        "firmware/gsp_tu10x.bin",
        "kernel/nvidia/nv-kernel.o_binary",
        "kernel-open/nvidia/nv-kernel.o_binary",
        "kernel-open/Makefile",
    ):
        assert (tree / expected).is_file(), expected
    assert not (tree / "kernel-open" / "debian").exists()
    assert not (tree / "kernel" / "NVIDIA_Changelog").exists()


def test_tree_has_no_symlinks_only_versioned_libraries(extracted: Extracted) -> None:
    assert not [path for path in extracted.tree.rglob("*") if path.is_symlink()]
    libraries = [path.name for path in extracted.tree.glob("lib*.so*")]
    unversioned = [name for name in libraries if not name.endswith(f".so.{extracted.version}")]
    # libnvidia-api is the one library whose name does not carry the driver version.
    assert unversioned == ["libnvidia-api.so.1"]


def test_stub_refuses_an_existing_target(extracted: Extracted) -> None:
    result = sh(extracted.runfile, "-x", "--target", extracted.tree)
    assert result.returncode != 0
    assert "already exists" in result.stderr


def test_header_keys_describe_the_package(extracted: Extracted) -> None:
    keys = header_keys(extracted.runfile)
    version = extracted.version
    assert keys["label"] == f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}"
    assert keys["version_string"] == version
    assert keys["targetdir"] == f"NVIDIA-Linux-x86_64-{version}"
    assert keys["TARGET_ARCH"] == "x86_64"
    assert keys["script"] == "./nvidia-installer"
    assert extracted.runfile.read_bytes()[:10] == b"#! /bin/sh"


def test_skip_points_at_the_compressed_tar_after_the_decompressor(extracted: Extracted) -> None:
    keys = header_keys(extracted.runfile)
    skip, skip_decompress = int(keys["skip"]), int(keys["skip_decompress"])
    assert skip == skip_decompress + int(keys["size_decompress"])
    with extracted.runfile.open("rb") as stream:
        stream.seek(payload_offset(extracted.runfile, skip_decompress))
        assert stream.read(4) == b"\x7fELF"  # the embedded fallback zstd
        stream.seek(payload_offset(extracted.runfile, skip))
        assert stream.read(4) == ZSTD_MAGIC


def test_crc_and_md5_cover_line_four_to_eof(extracted: Extracted) -> None:
    keys = header_keys(extracted.runfile)
    crc = PosixCksum()
    md5 = hashlib.md5()  # noqa: S324 - the format's own checksum
    with extracted.runfile.open("rb") as stream:
        stream.seek(payload_offset(extracted.runfile, 4))
        while chunk := stream.read(1 << 20):
            crc.update(chunk)
            md5.update(chunk)
    assert str(crc.value()) == keys["CRCsum"]
    assert md5.hexdigest() == keys["MD5"]
    # The Python CRC is POSIX cksum's: checked once against the real tool.
    assert cksum_from_line_four(extracted.runfile) == keys["CRCsum"]


def cksum_from_line_four(runfile: Path) -> str:
    """``tail -n +4 runfile | cksum``, the stub's own computation."""
    with subprocess.Popen(["tail", "-n", "+4", runfile], stdout=subprocess.PIPE) as tail:
        cksum = subprocess.run(
            ["cksum"], stdin=tail.stdout, capture_output=True, text=True, check=True
        )
    return cksum.stdout.split()[0]


def test_check_passes_and_catches_a_flipped_byte(extracted: Extracted, tmp_path: Path) -> None:
    assert sh(extracted.runfile, "--check").returncode == 0
    corrupted = tmp_path / extracted.runfile.name
    shutil.copyfile(extracted.runfile, corrupted)
    with corrupted.open("r+b") as stream:
        stream.seek(-1000, 2)
        byte = stream.read(1)
        stream.seek(-1000, 2)
        stream.write(bytes([byte[0] ^ 0xFF]))
    result = sh(corrupted, "--check")
    assert result.returncode == 2
    assert "CRC mismatch" in result.stderr


def test_tar_members_are_dot_slash_relative(extracted: Extracted) -> None:
    listing = sh(extracted.runfile, "--list")
    assert listing.returncode == 0, listing.stderr
    names = [line.split()[-1] for line in listing.stdout.splitlines() if line.strip()]
    assert "./.manifest" in names
    assert all(name.startswith("./") for name in names)


def test_stub_falls_back_to_its_embedded_decompressor(extracted: Extracted, tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in STUB_TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (tools / tool).symlink_to(found)
    shell = shutil.which("sh")
    assert shell is not None
    listing = subprocess.run(
        [shell, extracted.runfile, "--list"],
        env={**os.environ, "PATH": str(tools), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    assert "./.manifest" in listing.stdout
    assert list(tmp_path.glob("makeself.*/zstd")), "the embedded zstd was not used"


def test_xz_fixture_has_an_unchecked_xz_payload(xz_runfile: Path) -> None:
    runfile = xz_runfile
    assert sh(runfile, "--check").returncode == 0
    with runfile.open("rb") as stream:
        stream.seek(payload_offset(runfile, int(header_keys(runfile)["skip"])))
        header = stream.read(12)
        # Stream flags 00 00: no integrity check, as nv2's xzminicomp needs (xz -C none).
        assert header[:6] == XZ_MAGIC
        assert header[6:8] == b"\x00\x00"
        stream.seek(-12, os.SEEK_CUR)
        with lzma.open(stream) as tar_stream, tarfile.open(fileobj=tar_stream, mode="r|") as tar:
            first = next(iter(tar))
    assert first.name.startswith("./")


def test_fixture_is_cached_per_version_and_revision(extracted: Extracted) -> None:
    again = build_run_fixture(extracted.version)
    assert again == extracted.runfile
    assert again.parent.name == f"{extracted.version}-zstd-r{FORMAT_REVISION}"


# --- the manifest ----------------------------------------------------------------------------


def test_manifest_header_has_eight_lines(extracted: Extracted) -> None:
    lines = (extracted.tree / ".manifest").read_text().splitlines()
    assert lines[0] == "NVIDIA Accelerated Graphics Driver for Linux-x86_64"
    assert lines[1] == extracted.version
    assert lines[3].split() == ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm",
                                "nvidia-peermem"]  # fmt: skip
    assert lines[2] == lines[4] == lines[5] == " "
    assert lines[6:8] == ["./kernel/", "./kernel/precompiled/"]
    assert "" not in lines  # nvidia-installer stops reading at the first empty line


def test_manifest_lists_every_file_and_only_those(extracted: Extracted) -> None:
    listed = {entry.path for entry in manifest_entries(extracted.tree) if entry.mode != "0000"}
    assert listed == files_in(extracted.tree)


def test_manifest_modes_are_the_tree_modes(extracted: Extracted) -> None:
    for entry in manifest_entries(extracted.tree):
        if entry.mode != "0000":
            mode = (extracted.tree / entry.path).stat().st_mode & 0o7777
            assert manifest_mode(mode) == entry.mode, entry.path


def test_symlink_entries_name_files_that_are_listed(extracted: Extracted) -> None:
    entries = manifest_entries(extracted.tree)
    names = {entry.path for entry in entries}
    links = [entry for entry in entries if entry.mode == "0000"]
    assert {entry.file_type for entry in links} <= SYMLINK_TYPES
    for link in links:
        assert link.fields[-1] in names, link
        assert not (extracted.tree / link.path).exists()


def test_every_library_soname_has_a_symlink_entry(extracted: Extracted) -> None:
    links = {entry.path for entry in manifest_entries(extracted.tree) if entry.mode == "0000"}
    for library in extracted.tree.glob(f"lib*.so.{extracted.version}"):
        soname = elf_soname(library)
        if soname is None:
            assert library.name.startswith("libnvidia-vulkan-producer."), library  # by full name
            continue
        assert soname in links or soname == library.name, library.name


def elf_soname(library: Path) -> str | None:
    dynamic = subprocess.run(
        ["objdump", "-p", library], capture_output=True, text=True, check=True
    ).stdout
    for line in dynamic.splitlines():
        words = line.split()
        if words[:1] == ["SONAME"]:
            return words[1]
    return None


def test_kernel_sources_and_firmware_inherit_their_paths(extracted: Extracted) -> None:
    for entry in manifest_entries(extracted.tree):
        top = entry.path.split("/")[0]
        if top in {"kernel", "kernel-open"}:
            assert entry.file_type in {"KERNEL_MODULE_SRC", "DKMS_CONF"}, entry
            assert entry.fields == ["INHERIT_PATH_DEPTH:1"], entry
        if top == "firmware":
            assert (entry.file_type, entry.fields) == ("FIRMWARE", ["INHERIT_PATH_DEPTH:1"])


def test_compute_files_have_their_expected_types(extracted: Extracted) -> None:
    by_path = {entry.path: entry for entry in manifest_entries(extracted.tree)}
    version = extracted.version
    expected = {
        f"libcuda.so.{version}": ("CUDA_LIB", ["NATIVE", "/"]),
        "libcuda.so.1": ("CUDA_SYMLINK", ["NATIVE", "/", f"libcuda.so.{version}"]),
        f"libnvidia-cfg.so.{version}": ("UTILITY_LIB", ["NATIVE"]),
        f"libnvidia-opencl.so.{version}": ("OPENCL_LIB", ["NATIVE", "/"]),
        "nvidia-smi": ("UTILITY_BINARY", []),
        "nvidia-smi.1.gz": ("MANPAGE", ["man1/"]),
        "nvidia-modprobe": ("NVIDIA_MODPROBE", ["/usr/bin/"]),
        "nvidia.icd": ("CUDA_ICD", []),
    }
    for path, (file_type, fields) in expected.items():
        assert (by_path[path].file_type, by_path[path].fields) == (file_type, fields), path
    assert by_path["nvidia-modprobe"].mode == "04755"
