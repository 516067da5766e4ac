"""Symbolic links that pass a check as text but resolve outside the tree, through one another.

The chain: ``r -> ../../../../..`` climbs exactly to the extraction root (fine as text);
``p1 -> r/..`` is fine as text too, but resolves to the root's parent, ``p2 -> p1/..`` to the
one above, and so on up to ``/``; ``build/scripts -> p20/<a directory outside>`` then reaches
any directory of the machine. Nothing outside the staging directory may change, whether the
download's signature is good or not.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import socket
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fetch_gpg import Keys, publish, release_keys
from fetch_server import ReleaseServer
from kerneltree_fixtures import (
    KERNEL,
    LINUX_FILESYSTEM,
    GptPartition,
    bzip2_file,
    copy_tool,
    flatcar_build_tree,
    gpt_disk,
    install_machine_runtime,
    machine_runtime,
    mkfs_ext4,
    write,
)
from simhost import SimulatedHost
from tools import needs

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import elf
from nvidia_driver.kbuild import container, devcontainer, hosttree
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.links import escaping_links, resolve_within, tree_links
from nvidia_driver.paths import Paths
from nvidia_driver.sources.flatcar import ReleaseServer as FlatcarServer
from nvidia_driver.sources.verify import Trust

VERSION = "4230.2.4"
ARCHIVE = f"stable/amd64-usr/{VERSION}/flatcar-container.tar.gz"
CLIMB = 20  # more levels than any temporary directory is deep: p20 is /
MODULES = f"usr/lib/modules/{KERNEL}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keys]:
    with release_keys(tmp_path_factory.mktemp("gpg")) as made:
        yield made


@dataclass(frozen=True)
class Sentinel:
    """A directory outside every tree, with a dynamically linked ELF tool in it."""

    directory: Path

    @classmethod
    def create(cls, directory: Path) -> Sentinel:
        copy_tool("/bin/true", directory / "basic/fixdep")
        write(directory / "note.txt", "left alone\n")
        return cls(directory)

    def state(self) -> dict[str, str]:
        return {
            str(path.relative_to(self.directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(self.directory.rglob("*"))
            if path.is_file()
        }

    @property
    def link_target(self) -> str:
        """Where build/scripts points: up the chain to /, then down to this directory."""
        return f"p{CLIMB}/{self.directory.as_posix().lstrip('/')}"


def chain(directory: str) -> list[tuple[str, str]]:
    """(link, target) of the chain, in ``directory`` (relative to the root)."""
    depth = len(directory.split("/"))
    links = [(f"{directory}/r", "/".join([".."] * depth)), (f"{directory}/p1", "r/..")]
    links += [(f"{directory}/p{n}", f"p{n - 1}/..") for n in range(2, CLIMB + 1)]
    return links


def chain_tarball(sentinel: Sentinel) -> bytes:
    """A flatcar-container.tar.gz whose build/scripts reaches the sentinel through the chain."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:

        def add(name: str, data: bytes | None = None, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            info.size, info.mode = len(data or b""), 0o755
            archive.addfile(info, io.BytesIO(data) if data is not None else None)

        add(f"{MODULES}/build/Makefile", b"# kernel Makefile\n")
        add(f"{MODULES}/source", link="build")
        for link, target in chain(f"{MODULES}/build"):
            add(link, link=target)
        add(f"{MODULES}/build/scripts", link=sentinel.link_target)
        # The loader and libc the relocation would copy next to the wrapped tools.
        for name, path in machine_runtime().items():
            add(f"usr/lib64/{name}", path.read_bytes())
    return buffer.getvalue()


@pytest.mark.parametrize("signed_by", ["other", "trusted"])
def test_a_link_chain_in_the_container_tarball_changes_nothing_outside(
    tmp_path: Path, keys: Keys, signed_by: str
) -> None:
    sentinel = Sentinel.create(tmp_path / "outside")
    before = sentinel.state()
    signer = keys.other if signed_by == "other" else keys.trusted
    with ReleaseServer(tmp_path / "release") as server:
        publish(server.root, ARCHIVE, chain_tarball(sentinel), signer)
        releases = FlatcarReleases(
            Commands(),
            tmp_path / "cache",
            tmp_path / "cache",  # the work directory too: the tree lands in cache/trees
            server=FlatcarServer(server.url("{channel}")),
            trust=Trust.of_keyring(keys.armored),
        )
        expected = (
            "signed by a key that is not in the keyring"
            if signed_by == "other"
            else r"resolves out of the extraction directory \(usr/lib/modules/.*/p1 -> r/\.\."
        )
        with pytest.raises(DriverError, match=expected) as failure:
            releases.container_tree(VERSION, "amd64", KERNEL)

    assert "\n" not in str(failure.value)
    assert sentinel.state() == before
    assert not list((tmp_path / "cache/trees").iterdir())


def test_tool_directories_that_are_links_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "flatcar"
    build = flatcar_build_tree(root / MODULES / "build")
    shutil.move(build / "scripts", root / "elsewhere")
    (build / "scripts").symlink_to("../../../../../elsewhere")  # inside the root: still refused
    (root / MODULES / "source").symlink_to("build")
    install_machine_runtime(root)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)

    with pytest.raises(DriverError, match="has scripts/ as a symbolic link") as failure:
        container.extract_container_tree(io.BytesIO(archive.getvalue()), tmp_path / "tree", KERNEL)
    assert "\n" not in str(failure.value)
    assert elf.read_elf(root / "elsewhere/basic/fixdep") is not None  # not wrapped


def test_a_link_chain_in_the_hosts_tree_is_left_out_of_the_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sentinel = Sentinel.create(tmp_path / "outside")
    before = sentinel.state()
    paths = Paths(tmp_path / "root")
    host = paths.host_filesystem
    build = flatcar_build_tree(host / MODULES / "build")
    shutil.rmtree(build / "scripts")
    for link, target in chain(f"{MODULES}/build"):
        (host / link).symlink_to(target)
    (build / "scripts").symlink_to(sentinel.link_target)
    install_machine_runtime(host)
    destination = tmp_path / "cache/tree"

    tree = hosttree.host_tree(paths, KERNEL, destination)

    assert tree is not None
    assert sentinel.state() == before
    assert escaping_links(destination, tree_links(destination)) == []
    assert not (tree.build_dir / "scripts").is_symlink()
    assert (tree.build_dir / "tools/objtool/objtool.real").is_file()  # the rest is wrapped
    assert f"{MODULES}/build/scripts resolves outside the kernel tree" in capsys.readouterr().out


@needs("mkfs.ext4", "debugfs", "partx")
def test_a_link_chain_in_the_developer_container_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sentinel = Sentinel.create(tmp_path / "outside")
    source = tmp_path / "source"
    flatcar_build_tree(source / MODULES / "build")
    for link, target in chain("usr/lib"):
        (source / link).symlink_to(target)
    (source / "usr/lib/escape").symlink_to(sentinel.link_target)
    mkfs_ext4(tmp_path / "root.img", source, 16 << 20, ["-b", "4096"])
    disk = gpt_disk(
        tmp_path / "disk.bin", [GptPartition(9, LINUX_FILESYSTEM, "ROOT", tmp_path / "root.img")]
    )
    compressed = bzip2_file(disk, tmp_path / "flatcar_developer_container.bin.bz2")

    root = devcontainer.extract_developer_container(
        compressed, tmp_path / "dev", ["usr/lib"], Commands()
    )

    assert escaping_links(root, tree_links(root)) == []
    assert not (root / "usr/lib/p1").is_symlink()
    assert (root / "usr/lib/r").is_symlink()  # it climbs to the root, not above
    assert "usr/lib/escape resolves outside the developer container" in capsys.readouterr().out
    tree = devcontainer.developer_container_tree(root, KERNEL)
    assert tree.build_dir == root / MODULES / "build"


# resolve_within: every component, and ".." folded after the link it follows.


def test_resolve_within_follows_links_in_the_middle_of_a_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write(root / "usr/lib/modules/k/build/Makefile")
    (root / "lib").symlink_to("/usr/lib")  # absolute: the host's /usr/lib, not the container's
    write(tmp_path / "usr/lib/modules/k/build/Makefile", "outside\n")
    assert resolve_within(root, root / "lib/modules/k/build/Makefile") == (
        root / "usr/lib/modules/k/build/Makefile"
    )


def test_resolve_within_folds_dot_dot_physically_and_never_above_the_root(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/os-release").symlink_to("/../../../usr/lib/os-release")
    (root / "etc/deep").symlink_to("../usr/lib")
    assert resolve_within(root, root / "etc/os-release") == root / "usr/lib/os-release"
    # deep/.. is usr (where the link leads), not etc (what the text says).
    assert resolve_within(root, root / "etc/deep/../x") == root / "usr/x"
    assert resolve_within(root, root / "../../etc") == root / "etc"


def test_resolve_within_refuses_a_loop(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(DriverError, match="too many levels of symbolic links"):
        resolve_within(tmp_path, tmp_path / "a")


# A host whose os-release cannot be read (here: a socket, which no one can open as a file).


@pytest.mark.parametrize("command", ["status", "init"])
def test_an_unreadable_os_release_is_one_line(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    host.path("/host-etc/os-release").unlink()
    etc = host.path("/proc/1/root/etc")
    etc.mkdir(parents=True)
    monkeypatch.chdir(etc)  # a socket's path is limited to 108 bytes: bind it relative
    with socket.socket(socket.AF_UNIX) as unreadable:
        unreadable.bind("os-release")
        result = host.run(command)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"ERROR: cannot read {etc}/os-release: ")
