"""A signed artifact is used only for the release it says it belongs to.

Flatcar signs each artifact, not the pair (release, artifact): an older release's signed
tarball, DIGESTS and signature pass every check when served under a newer release's URL. The
container tarball and the developer container carry /usr/share/flatcar/release (flatcar/scripts
build_library/set_lsb_release), which the verified bytes are checked against.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fetch_gpg import Signer, publish
from fetch_server import ReleaseServer
from kerneltree_fixtures import (
    KERNEL,
    LINUX_FILESYSTEM,
    GptPartition,
    bzip2_file,
    flatcar_build_tree,
    flatcar_root,
    gpt_disk,
    mkfs_ext4,
    tar_gz,
    write,
)
from tools import needs, require

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.sources.download import DownloadLimits, Opened
from nvidia_driver.sources.flatcar import ReleaseServer as FlatcarServer
from nvidia_driver.sources.flatcar import check_release_file
from nvidia_driver.sources.verify import Trust

NEW, OLD = "4593.2.5", "4593.2.4"
# Where the release server publishes NEW's artifacts.
CONTAINER = f"stable/amd64-usr/{NEW}/flatcar-container.tar.gz"
DEVCONTAINER = f"stable/amd64-usr/{NEW}/flatcar_developer_container.bin.bz2"
APPID = "{e96281a6-d1af-4bde-9a0a-97b76e56dc57}"


def release_file(version: str, board: str = "amd64-usr") -> str:
    """/usr/share/flatcar/release as set_lsb_release writes it."""
    return (
        f"FLATCAR_RELEASE_VERSION={version}\n"
        f"FLATCAR_RELEASE_BOARD={board}\n"
        f"FLATCAR_RELEASE_APPID={APPID}\n"
    )


def root_of(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "root"
    write(root / "usr/share/flatcar/release", text)
    return root


# --- the check ------------------------------------------------------------------------------


def test_the_release_file_of_the_wanted_release_passes(tmp_path: Path) -> None:
    check_release_file(root_of(tmp_path, release_file(NEW)), NEW, "amd64", "artifact")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (release_file(OLD), f"Flatcar {OLD} (amd64-usr)"),
        (release_file(NEW, "arm64-usr"), f"Flatcar {NEW} (arm64-usr)"),
        ("FLATCAR_RELEASE_APPID=x\n", "Flatcar ? (?)"),
    ],
)
def test_the_release_file_of_another_release_is_refused(
    tmp_path: Path, text: str, found: str
) -> None:
    with pytest.raises(DriverError) as raised:
        check_release_file(root_of(tmp_path, text), NEW, "amd64", "https://x/flatcar.tar.gz")

    assert str(raised.value) == (
        f"https://x/flatcar.tar.gz is signed by Flatcar but is the file of {found}, not of "
        f"{NEW} (amd64-usr): the mirror or a proxy served another release's file under this "
        "URL; refusing it"
    )


def test_no_release_file_or_a_link_in_its_place_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"has no readable /usr/share/flatcar/release"):
        check_release_file(tmp_path, NEW, "amd64", "artifact")
    root = root_of(tmp_path, release_file(NEW))
    (root / "usr/share/flatcar/real").write_text(release_file(NEW))
    (root / "usr/share/flatcar/release").unlink()
    (root / "usr/share/flatcar/release").symlink_to("real")
    with pytest.raises(DriverError, match=r"has no readable .*cannot be tied to Flatcar"):
        check_release_file(root, NEW, "amd64", "artifact")


# --- a replayed container tarball -----------------------------------------------------------


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signer]:
    require("gpg", "gpgv")
    made = Signer.create(tmp_path_factory.mktemp("gpg") / "home", "Buildbot <b@example.invalid>")
    yield made
    made.stop_agent()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    with ReleaseServer(tmp_path / "release") as release_server:
        yield release_server


def releases(server: ReleaseServer, cache: Path, signer: Signer, tmp_path: Path) -> FlatcarReleases:
    keyring = signer.export(tmp_path / "keyring.asc", armor=True)
    return FlatcarReleases(
        Commands(),
        cache,
        cache,  # the work directory too: trees, devcontainers and downloads land under cache
        server=FlatcarServer(server.url("{channel}")),
        trust=Trust.of_keyring(keyring),
        limits=DownloadLimits(timeout=10),
    )


def container_tarball(tmp_path: Path, version: str) -> bytes:
    root = flatcar_root(tmp_path / f"flatcar-{version}")
    write(root / "usr/share/flatcar/release", release_file(version))
    return tar_gz(root)


def test_an_older_releases_tarball_under_a_new_releases_url_is_refused(
    server: ReleaseServer, signer: Signer, tmp_path: Path
) -> None:
    publish(server.root, CONTAINER, container_tarball(tmp_path, OLD), signer)
    cache = tmp_path / "cache"
    release = releases(server, cache, signer, tmp_path)

    with pytest.raises(DriverError, match=rf"is the file of Flatcar {OLD} \(amd64-usr\), not of"):
        release.container_tree(NEW, "amd64", KERNEL)

    assert list((cache / "trees").iterdir()) == []  # nothing published, nothing staged


def test_the_releases_own_tarball_is_used_and_its_cached_tree_rechecked(
    server: ReleaseServer, signer: Signer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish(server.root, CONTAINER, container_tarball(tmp_path, NEW), signer)
    cache = tmp_path / "cache"
    release = releases(server, cache, signer, tmp_path)

    tree = release.container_tree(NEW, "amd64", KERNEL)
    again = release.container_tree(NEW, "amd64", KERNEL)

    assert again == tree
    assert (tree.build_dir / "Makefile").is_file()
    assert "Using the cached kernel build tree" in capsys.readouterr().out
    # A tree cached before trees named their release is fetched again, not trusted.
    [cached] = (cache / "trees").iterdir()
    (cached / "usr/share/flatcar/release").unlink()
    release.container_tree(NEW, "amd64", KERNEL)
    assert "does not name its release; fetching it again" in capsys.readouterr().out
    assert server.requests[f"/stable/amd64-usr/{NEW}/flatcar-container.tar.gz"] == 2


# --- a replayed developer container ---------------------------------------------------------


def developer_container(tmp_path: Path, version: str) -> bytes:
    source = tmp_path / f"dev-{version}"
    flatcar_build_tree(source / "usr/lib/modules" / KERNEL / "build")
    write(source / "usr/bin/gcc", "#!/bin/sh\n", mode=0o755)
    write(source / "usr/share/flatcar/release", release_file(version))
    partition = tmp_path / f"root-{version}.ext4"
    mkfs_ext4(partition, source, 8 << 20, [])
    disk = gpt_disk(
        tmp_path / f"disk-{version}.bin", [GptPartition(9, LINUX_FILESYSTEM, "ROOT", partition)]
    )
    return bzip2_file(disk, tmp_path / f"dev-{version}.bin.bz2").read_bytes()


@needs("mkfs.ext4")
def test_an_older_releases_developer_container_is_refused_and_forgotten(
    server: ReleaseServer, signer: Signer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The unpacked container gets /dev/null, /dev/zero and /dev/urandom for its chroot: mknod
    # needs root (CAP_MKNOD), which unit tests do not have. The nodes it asks for are recorded
    # (and stand in as empty files); the integration tests build in such a chroot as root.
    nodes: dict[str, tuple[int, int, int]] = {}

    def mknod(path: Path, mode: int, device: int) -> None:
        nodes[Path(path).name] = (stat.S_IFMT(mode), os.major(device), os.minor(device))
        Path(path).touch()

    monkeypatch.setattr(os, "mknod", mknod)
    publish(server.root, DEVCONTAINER, developer_container(tmp_path, OLD), signer)
    cache = tmp_path / "cache"
    release = releases(server, cache, signer, tmp_path)

    with pytest.raises(DriverError, match=rf"is the file of Flatcar {OLD} \(amd64-usr\)"):
        release.developer_container(NEW, "amd64", KERNEL)

    assert list((cache / "devcontainers").iterdir()) == []
    assert list((cache / "downloads/urls").iterdir()) == []  # not cached under the new URL
    publish(server.root, DEVCONTAINER, developer_container(tmp_path, NEW), signer)
    tree = release.developer_container(NEW, "amd64", KERNEL)
    assert (tree.build_dir / "Makefile").is_file()
    assert nodes == {device: (stat.S_IFCHR, 1, minor)
                     for device, minor in (("null", 3), ("zero", 5), ("urandom", 9))}  # fmt: skip


# --- a full disk ------------------------------------------------------------------------------


def test_a_disk_filling_up_while_a_release_artifact_downloads_is_one_line(
    server: ReleaseServer, signer: Signer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The developer container (480 MB, into the work directory) is the largest download a
    build makes: a full disk ends it with one line that says where to make room."""
    publish(server.root, DEVCONTAINER, b"developer container", signer)
    cache = tmp_path / "cache"
    release = releases(server, cache, signer, tmp_path)

    def disk_full(self: Opened, destination: Path, *args: object, **kwargs: object) -> str:
        destination.write_bytes(b"devel")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Opened, "save_to", disk_full)
    with pytest.raises(DriverError) as failed:
        release.developer_container(NEW, "amd64", KERNEL)

    message = str(failed.value)
    assert message.startswith(f"cannot download {server.url('stable')}/amd64-usr/{NEW}/")
    assert message.endswith(
        f"No space left on device; make room in {cache / 'downloads'} (or make it writable) "
        "and retry"
    )
    assert not [path for path in (cache / "downloads").rglob("*") if path.is_file()]
