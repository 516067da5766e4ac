from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import uuid
from pathlib import Path

import pytest
from kerneltree_fixtures import (
    DECOMPRESSORS,
    KERNEL,
    LINUX_FILESYSTEM,
    MANY,
    GptPartition,
    OneWayStream,
    bzip2_file,
    copy_tool,
    decompressor_commands,
    developer_container_source,
    flatcar_build_tree,
    flatcar_root,
    gpt_disk,
    install_machine_runtime,
    machine_runtime,
    member,
    mkfs_ext4,
    tar_gz,
    tar_gz_members,
    write,
)
from tools import needs

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import elf
from nvidia_driver.kbuild import container, devcontainer, hosttools, hosttree, kerneltree
from nvidia_driver.kbuild.compiler import Toolchain
from nvidia_driver.paths import Paths

needs_e2fsprogs = needs("mkfs.ext4", "debugfs", "partx")
TOOLS = ("scripts/basic/fixdep", "scripts/mod/modpost", "tools/objtool/objtool")


def mapped_files(objtool: Path) -> str:
    """What the wrapped tool (a copy of cat) has mapped: its loader and libc show there."""
    return subprocess.run(
        [objtool, "/proc/self/maps"], capture_output=True, text=True, check=True
    ).stdout


def assert_runs_with(build: Path, lib_dir: Path) -> None:
    assert subprocess.run([build / "scripts/basic/fixdep"], check=False).returncode == 0
    echoed = subprocess.run(
        [build / "scripts/mod/modpost", "-a", "two words"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout == "-a two words\n"
    maps = mapped_files(build / "tools/objtool/objtool")
    for name in machine_runtime():
        assert str((lib_dir / name).resolve()) in maps


def leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir()) if parent.exists() else []


# ELF and host tools.


def test_read_elf_finds_the_interpreter_and_needed_libraries(tmp_path: Path) -> None:
    info = elf.read_elf(Path("/bin/true"))
    assert info is not None
    assert info.interpreter is not None
    assert Path(info.interpreter).name in machine_runtime()
    assert "libc.so.6" in info.needed
    assert elf.read_elf(write(tmp_path / "script", "#!/bin/sh\n")) is None
    assert elf.read_elf(write(tmp_path / "short", "\x7fEL")) is None
    assert elf.read_elf(tmp_path / "missing") is None


def test_install_runtime_copies_the_loader_and_the_closure_only(tmp_path: Path) -> None:
    flatcar = tmp_path / "flatcar"
    install_machine_runtime(flatcar)
    write(flatcar / "usr/lib64/libjunk.so.1", "junk")
    installed = hosttools.install_runtime([Path("/bin/cat")], flatcar, tmp_path / "lib")
    assert installed == sorted(machine_runtime())
    assert sorted(path.name for path in (tmp_path / "lib").iterdir()) == installed


def test_install_runtime_names_a_missing_library(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"libc\.so\.6, needed by the kernel tree's cat"):
        hosttools.install_runtime([Path("/bin/cat")], tmp_path / "empty", tmp_path / "lib")


def test_relocated_tools_run_with_the_toolchain_roots_glibc(tmp_path: Path) -> None:
    build = flatcar_build_tree(tmp_path / "tree/build")
    toolchain = tmp_path / "toolchain"
    install_machine_runtime(toolchain)
    before = (build / "scripts/basic/fixdep").stat().st_mtime_ns

    wrapped = hosttools.relocate_host_tools(hosttools.host_tools(build), toolchain)

    assert sorted(wrapped) == sorted(build / tool for tool in TOOLS)
    for tool in TOOLS:
        assert (build / tool).read_bytes().startswith(b"#!/bin/sh\n")
        assert elf.read_elf(build / f"{tool}.real") is not None
    assert (build / "scripts/basic/fixdep").stat().st_mtime_ns == before
    assert (build / "scripts/checkpatch.pl").read_text() == "#!/usr/bin/perl\n"
    assert_runs_with(build, toolchain / "usr/lib64")


def test_relocated_tools_still_run_when_the_tree_moves_or_is_reached_by_symlink(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    build = flatcar_build_tree(root / "build")
    install_machine_runtime(root)
    hosttools.relocate_host_tools(hosttools.host_tools(build), root)
    root.rename(tmp_path / "moved")
    (tmp_path / "link").symlink_to(tmp_path / "moved/build")
    assert_runs_with(tmp_path / "link", tmp_path / "moved/usr/lib64")


def test_relocation_is_idempotent(tmp_path: Path) -> None:
    build = flatcar_build_tree(tmp_path / "build")
    install_machine_runtime(tmp_path)
    hosttools.relocate_host_tools(hosttools.host_tools(build), tmp_path)
    assert hosttools.relocate_host_tools(hosttools.host_tools(build), tmp_path) == []
    assert not list(build.rglob("*.real.real"))


def test_relocation_refuses_tools_of_another_architecture(tmp_path: Path) -> None:
    tool = copy_tool("/bin/true", tmp_path / "build/scripts/basic/fixdep")
    data = bytearray(tool.read_bytes())
    data[18] = 183 if data[18] != 183 else 62  # e_machine: aarch64, or x86-64 on aarch64
    tool.write_bytes(bytes(data))
    install_machine_runtime(tmp_path)
    with pytest.raises(hosttools.ForeignToolsError, match=r"is built for ELF machine .* here"):
        hosttools.relocate_host_tools(hosttools.host_tools(tmp_path / "build"), tmp_path)


def test_relocation_needs_the_loader(tmp_path: Path) -> None:
    flatcar_build_tree(tmp_path / "build")
    with pytest.raises(DriverError, match="no ld-linux"):
        hosttools.relocate_host_tools(hosttools.host_tools(tmp_path / "build"), tmp_path / "empty")


# 1. The host's tree.


def test_host_tree_copies_the_hosts_tree_and_its_glibc(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem)
    destination = tmp_path / "cache/tree"

    tree = hosttree.host_tree(paths, KERNEL, destination)

    assert tree is not None
    assert tree.origin == kerneltree.HOST
    assert tree.build_dir == destination / "usr/lib/modules" / KERNEL / "build"
    assert tree.source_dir == tree.build_dir
    assert tree.toolchain_root is None
    assert sorted(path.name for path in (destination / "usr/lib64").iterdir()) == sorted(
        machine_runtime()
    )
    assert_runs_with(tree.build_dir, destination / "usr/lib64")
    # The host's own tree is left as it was.
    host_fixdep = paths.host_kernel_tree(KERNEL) / "scripts/basic/fixdep"
    assert elf.read_elf(host_fixdep) is not None
    assert leftovers(tmp_path / "cache") == ["tree"]


def test_host_tree_with_separate_source_keeps_the_links_inside(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem, split_source=True)
    destination = tmp_path / "tree"

    tree = hosttree.host_tree(paths, KERNEL, destination)

    assert tree is not None
    assert tree.source_dir == destination / "usr/lib/modules" / KERNEL / "source"
    assert (tree.source_dir / "Makefile").is_file()
    # build/source pointed at the host's absolute path; now it points into the copy.
    assert (tree.build_dir / "source").readlink() == Path("../source")
    assert (tree.build_dir / "source/include/linux/module.h").is_file()


def test_host_tree_follows_an_absolute_build_link_within_the_host(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "root")
    host = paths.host_filesystem
    flatcar_build_tree(host / "usr/src/linux")
    install_machine_runtime(host)
    modules = host / "usr/lib/modules" / KERNEL
    modules.mkdir(parents=True)
    (modules / "build").symlink_to("/usr/src/linux")

    tree = hosttree.host_tree(paths, KERNEL, tmp_path / "tree")

    assert tree is not None
    assert (tree.build_dir / "Module.symvers").is_file()


def test_a_full_disk_is_told_apart_from_a_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copytree", disk_full)
    with pytest.raises(DriverError, match=r"No space left on device; make room in .*/cache"):
        hosttree.host_tree(paths, KERNEL, tmp_path / "cache/tree")
    assert leftovers(tmp_path / "cache") == []


def test_a_disk_filling_up_file_by_file_is_one_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copytree goes on past each file it cannot write and raises them all at the end, as
    text (shutil.Error, no errno): still one short line, and the advice to make room."""
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem)

    def disk_full(source: object, target: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(shutil, "copyfile", disk_full)
    with pytest.raises(DriverError) as failed:
        hosttree.host_tree(paths, KERNEL, tmp_path / "cache/tree")
    message = str(failed.value)
    assert "\n" not in message
    assert len(message) < 600, message
    assert "No space left on device" in message
    assert message.endswith(f"make room in {tmp_path / 'cache'} (or make it writable) and retry")
    assert leftovers(tmp_path / "cache") == []


def test_host_tree_is_none_without_a_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(tmp_path / "root")
    assert hosttree.host_tree(paths, KERNEL, tmp_path / "tree") is None
    write(paths.host_kernel_tree(KERNEL) / "README", "no Makefile\n")
    assert hosttree.host_tree(paths, KERNEL, tmp_path / "tree") is None
    assert "The host has no usable kernel build tree" in capsys.readouterr().out
    assert not (tmp_path / "tree").exists()


# 2. flatcar-container.tar.gz.


@pytest.mark.parametrize("prefix", ["./", ""])
@pytest.mark.parametrize("kernel", [KERNEL, None])
def test_container_tree_is_streamed_out_of_the_tarball(
    tmp_path: Path, prefix: str, kernel: str | None
) -> None:
    stream = OneWayStream(tar_gz(flatcar_root(tmp_path / "flatcar"), prefix))
    destination = tmp_path / "cache/tree"

    tree = container.extract_container_tree(stream, destination, kernel)

    modules = destination / "usr/lib/modules" / KERNEL
    assert tree == kerneltree.KernelTree(
        build_dir=modules / "build",
        source_dir=modules / "build",
        kernel_release=KERNEL,
        toolchain_root=None,
        origin=kerneltree.CONTAINER_TARBALL,
    )
    assert (modules / "source").readlink() == Path("build")
    assert (tree.build_dir / ".config").read_text().startswith("CONFIG_CC_VERSION_TEXT=")
    assert (tree.build_dir / "Module.symvers").samefile(tree.build_dir / "Module.symvers.orig")
    # Only the tree and the libraries its tools need; no modules, no other libraries.
    assert sorted(path.name for path in modules.iterdir()) == ["build", "source"]
    assert sorted(path.name for path in destination.iterdir()) == ["usr"]
    assert sorted(path.name for path in (destination / "usr/lib64").iterdir()) == sorted(
        machine_runtime()
    )
    assert_runs_with(tree.build_dir, destination / "usr/lib64")
    # Read to the end, so that a verifying stream has checked the whole download.
    assert stream.consumed == stream.size
    assert leftovers(tmp_path / "cache") == ["tree"]


def test_container_tree_with_separate_source(tmp_path: Path) -> None:
    stream = OneWayStream(tar_gz(flatcar_root(tmp_path / "flatcar", split_source=True)))
    tree = container.extract_container_tree(stream, tmp_path / "tree", None)
    assert tree.source_dir == tmp_path / "tree/usr/lib/modules" / KERNEL / "source"
    assert (tree.source_dir / "include/linux/module.h").is_file()
    assert (tree.build_dir / "source").readlink() == Path("../source")


def test_container_tree_picks_the_named_kernel_among_several(tmp_path: Path) -> None:
    root = flatcar_root(tmp_path / "flatcar")
    flatcar_build_tree(root / "usr/lib/modules/6.6.95-flatcar/build")
    tree = container.extract_container_tree(
        OneWayStream(tar_gz(root)), tmp_path / "tree", "6.6.95-flatcar"
    )
    assert tree.kernel_release == "6.6.95-flatcar"
    assert not (tmp_path / "tree/usr/lib/modules" / KERNEL).exists()


def test_container_tree_replaces_an_older_extraction(tmp_path: Path) -> None:
    destination = tmp_path / "tree"
    write(destination / "stale", "from an earlier run\n")
    data = tar_gz(flatcar_root(tmp_path / "flatcar"))
    container.extract_container_tree(OneWayStream(data), destination, KERNEL)
    assert not (destination / "stale").exists()
    assert leftovers(tmp_path) == ["flatcar", "tree"]


def test_container_tree_rewrites_absolute_links_inside_the_tree(tmp_path: Path) -> None:
    root = flatcar_root(tmp_path / "flatcar")
    build = root / "usr/lib/modules" / KERNEL / "build"
    (build / "include/asm").symlink_to(f"/usr/lib/modules/{KERNEL}/build/include/generated")
    tree = container.extract_container_tree(OneWayStream(tar_gz(root)), tmp_path / "tree", None)
    assert (tree.build_dir / "include/asm").readlink() == Path("generated")
    assert (tree.build_dir / "include/asm/autoconf.h").is_file()


@pytest.mark.parametrize(
    "tar_format",
    [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT],
    ids=["gnu", "pax", "ustar"],
)
def test_container_tree_is_read_from_gnu_pax_and_ustar_archives(
    tmp_path: Path, tar_format: int
) -> None:
    root = flatcar_root(tmp_path / "flatcar")
    build = root / "usr/lib/modules" / KERNEL / "build"
    # Longer than a header's 100 bytes: GNU long names, pax paths, ustar's prefix.
    deep = write(build / "include" / ("d" * 40) / ("e" * 40) / ("f" * 48 + ".h"), "#define X\n")
    relative = deep.relative_to(build)
    if tar_format != tarfile.USTAR_FORMAT:  # ustar has no room for these
        (build / "include/far").symlink_to(relative.relative_to("include"))
        # Past octal's 11 digits: GNU writes base-256, pax a record.
        os.utime(deep, (9_000_000_000, 9_000_000_000))
    stream = OneWayStream(tar_gz(root, tar_format=tar_format))

    tree = container.extract_container_tree(stream, tmp_path / "tree", None)

    assert (tree.build_dir / relative).read_text() == "#define X\n"
    assert int((tree.build_dir / relative).stat().st_mtime) == int(deep.stat().st_mtime)
    if tar_format != tarfile.USTAR_FORMAT:
        assert (tree.build_dir / "include/far").read_text() == "#define X\n"
    assert (tree.build_dir / "scripts/checkpatch.pl").stat().st_mode & 0o777 == 0o755
    assert_runs_with(tree.build_dir, tmp_path / "tree/usr/lib64")
    assert stream.consumed == stream.size


def test_container_tree_keeps_exact_modes_and_the_last_copy_of_a_member(tmp_path: Path) -> None:
    build = f"usr/lib/modules/{KERNEL}/build"
    script, header = member(f"{build}/script"), member(f"{build}/header.h")
    script.mode, header.mode = 0o777, 0o444  # beyond the umask; read-only
    data = tar_gz_members(
        [
            *_tree_members(),
            (script, b"#!/bin/sh\n"),
            (header, b"/* first */\n"),
            (member(f"{build}/header.h"), b"/* second */\n"),
        ]
    )
    tree = container.extract_container_tree(OneWayStream(data), tmp_path / "tree", None)
    assert (tree.build_dir / "script").stat().st_mode & 0o777 == 0o777
    assert (tree.build_dir / "header.h").read_text() == "/* second */\n"
    assert (tree.build_dir / "header.h").stat().st_mode & 0o777 == 0o644


def test_sparse_members_are_skipped_outside_the_tree(tmp_path: Path) -> None:
    sparse = member("usr/share/holes", tarfile.GNUTYPE_SPARSE)
    data = tar_gz_members([(sparse, b"s" * 1000), *_tree_members()], tarfile.GNU_FORMAT)
    tree = container.extract_container_tree(OneWayStream(data), tmp_path / "tree", None)
    assert (tree.build_dir / "Makefile").read_text() == "# Makefile\n"


def test_only_the_first_gzip_member_is_read_and_the_rest_drained(tmp_path: Path) -> None:
    stream = OneWayStream(tar_gz(flatcar_root(tmp_path / "flatcar")) + gzip.compress(b"junk"))
    container.extract_container_tree(stream, tmp_path / "tree", None)
    assert stream.consumed == stream.size


def _tree_members(kernel: str = KERNEL) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    build = f"usr/lib/modules/{kernel}/build"
    return [
        (member(build, tarfile.DIRTYPE), None),
        (member(f"{build}/Makefile"), b"# Makefile\n"),
    ]


def _escaping(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> bytes:
    return tar_gz_members(
        [
            *_tree_members(),
            (member(name, kind, linkname), b"x" if kind == tarfile.REGTYPE else None),
        ]
    )


BAD_ARCHIVES = {
    "not a gzip": (lambda: b"PK\x03\x04 a zip file", "cannot extract flatcar-container.tar.gz"),
    "truncated": (
        lambda: tar_gz_members(_tree_members())[:40],
        "cannot extract flatcar-container.tar.gz",
    ),
    "no kernel": (
        lambda: tar_gz_members([(member("usr/bin/bash"), b"bash")]),
        "holds no kernel build tree",
    ),
    "two kernels": (
        lambda: tar_gz_members([*_tree_members(), *_tree_members("6.6.95-flatcar")]),
        r"holds several kernels \(6.12.81-flatcar, 6.6.95-flatcar\)",
    ),
    "dot-dot member": (
        lambda: _escaping(f"usr/lib/modules/{KERNEL}/build/../../../../../../evil"),
        "would land outside the extraction directory",
    ),
    "absolute member": (lambda: _escaping("/etc/evil"), "would land outside"),
    "escaping symlink": (
        lambda: _escaping(
            f"usr/lib/modules/{KERNEL}/build/evil", tarfile.SYMTYPE, "../../../../../../etc"
        ),
        "has a symbolic link out of the extraction directory",
    ),
    "escaping symlink with a line break": (
        lambda: _escaping(
            f"usr/lib/modules/{KERNEL}/build/evil",
            tarfile.SYMTYPE,
            "../../../../../../../etc\nERROR: x",
        ),
        r"out of the extraction directory \(.*/evil -> (\.\./){7}etc\\nERROR: x\)",
    ),
    "hard link to an unextracted member": (
        lambda: tar_gz_members(
            [
                (member("usr/bin/bash"), b"bash"),
                *_tree_members(),
                (
                    member(f"usr/lib/modules/{KERNEL}/build/x", tarfile.LNKTYPE, "usr/bin/bash"),
                    None,
                ),
            ]
        ),
        "is a hard link to usr/bin/bash, which is not part of the kernel tree",
    ),
    "write through a symlink": (
        lambda: tar_gz_members(
            [
                *_tree_members(),
                (member(f"usr/lib/modules/{KERNEL}/build/inc", tarfile.SYMTYPE, "include"), None),
                (member(f"usr/lib/modules/{KERNEL}/build/inc/x.h"), b"x"),
            ]
        ),
        "is a symbolic link in the extracted tree: refusing to write through it",
    ),
    "directory then file": (
        lambda: tar_gz_members(
            [
                *_tree_members(),
                (member(f"usr/lib/modules/{KERNEL}/build/inc", tarfile.DIRTYPE), None),
                (member(f"usr/lib/modules/{KERNEL}/build/inc"), b"x"),
            ]
        ),
        "is both a directory and a file",
    ),
    "sparse file in the tree": (
        lambda: tar_gz_members(
            [
                *_tree_members(),
                (member(f"usr/lib/modules/{KERNEL}/build/x", tarfile.GNUTYPE_SPARSE), b"x"),
            ],
            tarfile.GNU_FORMAT,
        ),
        "is stored as a sparse file",
    ),
    "not a tar": (lambda: gzip.compress(b"not a tar archive" * 100), "not a tar archive"),
    "no Makefile": (
        lambda: tar_gz_members([(member(f"usr/lib/modules/{KERNEL}/build/.config"), b"")]),
        "has no Makefile",
    ),
    "wrong kernel": (lambda: tar_gz_members(_tree_members("6.6.95-flatcar")), "it has: 6.6.95"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_bad_archives_fail_with_one_line_and_leave_nothing(tmp_path: Path, case: str) -> None:
    build, expected = BAD_ARCHIVES[case]
    destination = tmp_path / "cache/tree"
    with pytest.raises(DriverError, match=expected) as failure:
        container.extract_container_tree(
            OneWayStream(build()), destination, None if case != "wrong kernel" else KERNEL
        )
    assert "\n" not in str(failure.value)
    assert leftovers(tmp_path / "cache") == []
    assert not [thread for thread in threading.enumerate() if thread.name == "inflate"]


def test_a_failed_extraction_keeps_the_previous_tree(tmp_path: Path) -> None:
    write(tmp_path / "tree/usr/lib/modules/x/build/Makefile", "previous\n")
    with pytest.raises(DriverError):
        container.extract_container_tree(OneWayStream(b"junk"), tmp_path / "tree", None)
    assert (tmp_path / "tree/usr/lib/modules/x/build/Makefile").read_text() == "previous\n"
    assert leftovers(tmp_path) == ["tree"]


# 3. The developer container.

WANTED = [
    f"usr/lib/modules/{KERNEL}",
    "usr/bin",
    "lib64",
    "lib64/libz.so.1",  # through the lib64 symlink: lands at usr/lib64/libz.so.1
    "usr/lib64",
    "usr/share/test",
    "usr/share/test/many",  # inside another wanted path: extracted once
    "usr/x86_64-cros-linux-gnu",  # absent: skipped with a warning
]


def _disk(tmp_path: Path, options: list[str], number: int = 9, name: str = "ROOT") -> Path:
    """A GPT disk whose partition holds ext4 of developer_container_source, htree and all."""
    source = developer_container_source(tmp_path / "source")
    partition = tmp_path / "root.ext4"
    mkfs_ext4(partition, source, 8 << 20, options)
    return gpt_disk(
        tmp_path / "disk.bin", [GptPartition(number, LINUX_FILESYSTEM, name, partition)]
    )


def _assert_extracted(root: Path, source: Path) -> None:
    share, original = root / "usr/share/test", source / "usr/share/test"
    for name in ["small.txt", "medium.txt", "empty", "big.bin", "sparse.bin", "tail-hole.bin"]:
        assert (share / name).read_bytes() == (original / name).read_bytes(), name
    assert len(list((share / "many").iterdir())) == MANY
    assert (share / f"many/an-entry-with-a-long-name-{MANY - 1}").read_text() == f"{MANY - 1}\n"
    assert (share / "slow-link").readlink() == Path("x" * 100)
    assert (share / "absolute-link").readlink() == Path("../../lib64/libc.so.6")
    assert (share / "absolute-link").read_text() == "a Flatcar libc\n"
    assert not (share / "escaping-link").is_symlink()
    # debugfs writes each name of a hard link as a file of its own.
    gcc = (root / "usr/bin/gcc").read_bytes()
    assert (root / "usr/bin/x86_64-cros-linux-gnu-gcc").read_bytes() == gcc
    assert stat.S_IMODE((root / "usr/bin/gcc").stat().st_mode) == 0o755
    assert (root / "lib64").readlink() == Path("usr/lib64")
    assert (root / "usr/lib64/libz.so.1").readlink() == Path("libz.so.1.3")
    build = root / "usr/lib/modules" / KERNEL / "build"
    assert (build / "scripts/basic/fixdep").read_bytes() == Path("/bin/true").read_bytes()
    assert (root / "usr/lib/modules" / KERNEL / "source").readlink() == Path("build")
    assert not (root / "etc").exists()


@needs_e2fsprogs
def test_the_root_partition_is_found_and_its_wanted_paths_extracted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = _disk(tmp_path, [])
    partitions = devcontainer.read_partitions(disk, disk.name, Commands())
    partition = devcontainer.root_partition(partitions, disk.stat().st_size, disk.name)
    assert (partition.number, partition.name, partition.offset) == (9, "ROOT", 2 << 20)
    (tmp_path / "root").mkdir()

    found = devcontainer.extract_root(
        disk, partition, WANTED, tmp_path / "root", label=disk.name, commands=Commands()
    )

    assert "usr/x86_64-cros-linux-gnu" not in found
    _assert_extracted(tmp_path / "root", tmp_path / "source")
    output = capsys.readouterr().out
    assert "/usr/x86_64-cros-linux-gnu is not in the developer container; skipped" in output
    assert "/usr/share/test/escaping-link points outside the developer container" in output


@pytest.mark.parametrize("kind", DECOMPRESSORS)
def test_decompress_sparse_leaves_zero_blocks_as_holes(tmp_path: Path, kind: str) -> None:
    image = tmp_path / "image.bin"
    with image.open("wb") as file:
        file.truncate(32 << 20)
        file.seek(5 << 20)
        file.write(b"data" * 2048)
    compressed = bzip2_file(image, tmp_path / "image.bin.bz2")

    commands = decompressor_commands(kind, tmp_path / "bin")
    size = devcontainer.decompress_sparse(compressed, tmp_path / "out.bin", commands)

    out = tmp_path / "out.bin"
    assert size == out.stat().st_size == 32 << 20
    assert out.read_bytes() == image.read_bytes()
    assert out.stat().st_blocks * 512 <= 1 << 20


@pytest.mark.parametrize("kind", DECOMPRESSORS)
@pytest.mark.parametrize("broken", ["not bzip2", "truncated"])
def test_decompress_sparse_rejects_a_broken_download(
    tmp_path: Path, broken: str, kind: str
) -> None:
    compressed = tmp_path / "image.bin.bz2"
    if broken == "truncated":
        write(tmp_path / "image.bin", "data " * 100_000)
        data = bzip2_file(tmp_path / "image.bin", compressed).read_bytes()
        compressed.write_bytes(data[: len(data) // 2])
    else:
        write(compressed, "not bzip2")
    commands = decompressor_commands(kind, tmp_path / "bin")
    with pytest.raises(
        DriverError, match=r"cannot decompress image\.bin\.bz2: .* fetch it again"
    ) as failure:
        devcontainer.decompress_sparse(compressed, tmp_path / "out.bin", commands)
    assert "\n" not in str(failure.value)


@pytest.fixture(scope="module")
def developer_container(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A compressed developer container and the tree it holds, made once: bzip2 is slow."""
    base = tmp_path_factory.mktemp("developer")
    compressed = bzip2_file(_disk(base, []), base / "flatcar_developer_container.bin.bz2")
    return compressed, base / "source"


@needs_e2fsprogs
def test_developer_container_is_extracted_without_a_loop_device(
    tmp_path: Path, developer_container: tuple[Path, Path]
) -> None:
    compressed, source = developer_container
    destination = tmp_path / "cache/developer"

    root = devcontainer.extract_developer_container(compressed, destination, WANTED, Commands())

    assert root == destination
    _assert_extracted(root, source)
    assert leftovers(tmp_path / "cache") == ["developer"]  # the sparse disk image is gone
    tree = devcontainer.developer_container_tree(root, None)
    assert tree.build_dir == root / "usr/lib/modules" / KERNEL / "build"
    assert tree.source_dir == tree.build_dir
    assert tree.toolchain_root == root
    assert tree.origin == kerneltree.DEVELOPER_CONTAINER
    assert Toolchain(tree.toolchain_root).inside(tree.build_dir) == Path(
        f"/usr/lib/modules/{KERNEL}/build"
    )
    # The tree's tools run inside the chroot, with the container's own glibc: left as built.
    assert elf.read_elf(tree.build_dir / "scripts/basic/fixdep") is not None


@needs_e2fsprogs
def test_developer_container_without_any_wanted_path_leaves_nothing(
    tmp_path: Path, developer_container: tuple[Path, Path]
) -> None:
    compressed, _ = developer_container
    with pytest.raises(
        DriverError, match="none of no/such/path is in flatcar_developer_"
    ) as failure:
        devcontainer.extract_developer_container(
            compressed, tmp_path / "cache/dev", ["no/such/path"], Commands()
        )
    assert "\n" not in str(failure.value)
    assert leftovers(tmp_path / "cache") == []


@needs("partx")
def test_developer_container_without_partition_9_leaves_nothing(tmp_path: Path) -> None:
    write(tmp_path / "usr-a.img", "\0" * 4096)
    disk = gpt_disk(
        tmp_path / "disk.bin", [GptPartition(3, LINUX_FILESYSTEM, "USR-A", tmp_path / "usr-a.img")]
    )
    compressed = bzip2_file(disk, tmp_path / "dev.bin.bz2")
    with pytest.raises(DriverError, match=r"dev.bin.bz2 has no partition 9 \(ROOT") as failure:
        devcontainer.extract_developer_container(
            compressed, tmp_path / "cache/dev", WANTED, Commands()
        )
    assert "\n" not in str(failure.value)
    assert leftovers(tmp_path / "cache") == []


@needs("partx")
def test_the_partition_table_is_checked(tmp_path: Path) -> None:
    write(tmp_path / "partition.img", "data")
    disk = gpt_disk(
        tmp_path / "disk.bin", [GptPartition(9, uuid.uuid4(), "OTHER", tmp_path / "partition.img")]
    )
    partitions = devcontainer.read_partitions(disk, "disk", Commands())
    assert [(p.number, p.name, p.offset) for p in partitions] == [(9, "OTHER", 2 << 20)]
    with pytest.raises(DriverError, match="has no partition 9"):
        devcontainer.root_partition(partitions, disk.stat().st_size, "disk")

    with disk.open("r+b") as image:  # the entries' CRC no longer matches: no table at all
        image.seek(2 * 512 + 8 * 128 + 56)
        image.write("ROOX".encode("utf-16-le"))
    assert devcontainer.read_partitions(disk, "disk", Commands()) == []

    write(tmp_path / "plain.bin", "\0" * 4096)
    with pytest.raises(DriverError, match=r"plain\.bin has no partition table partx can read"):
        devcontainer.read_partitions(tmp_path / "plain.bin", "plain.bin", Commands())


@needs_e2fsprogs
def test_partition_9_without_ext4_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "partition.img", "\0" * (1 << 20))
    disk = gpt_disk(
        tmp_path / "disk.bin",
        [GptPartition(9, LINUX_FILESYSTEM, "ROOT", tmp_path / "partition.img")],
    )
    [partition] = devcontainer.read_partitions(disk, "disk", Commands())
    (tmp_path / "root").mkdir()
    with pytest.raises(
        DriverError,
        match=r"disk: debugfs cannot extract the developer container from partition 9: .*"
        r"Bad magic number in super-block",
    ) as failure:
        devcontainer.extract_root(
            disk, partition, ["usr"], tmp_path / "root", label="disk", commands=Commands()
        )
    assert "\n" not in str(failure.value)


def test_developer_container_tree_needs_a_kernel(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="holds no kernel build tree"):
        devcontainer.developer_container_tree(tmp_path, None)
