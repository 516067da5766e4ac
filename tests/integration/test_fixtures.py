"""The integration fixtures themselves: a release server, artifacts and disks like Flatcar's."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import stat
import subprocess
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.debian import ensure_packages
from fixtures.devcontainer import ROOT_FIRST_LBA, ROOT_LABEL, ROOT_PARTITION
from fixtures.gpg import SigningKey
from fixtures.gpt import LINUX_FILESYSTEM, SECTOR, Partition, read_gpt
from fixtures.http_server import Fault
from fixtures.image_node import kbuild_module_in_image
from fixtures.images import Invoke
from fixtures.kernel import KernelTree
from fixtures.release_server import (
    ARTIFACTS,
    CONTAINER_TARBALL,
    DEVELOPER_CONTAINER,
    KERNEL_CONFIG,
    TEST_RELEASE,
    VERSION_TXT,
    VMLINUZ,
    FlatcarReleaseServer,
    ReleaseArtifacts,
    build_release_artifacts,
)

from nvidia_driver.commands import Commands
from nvidia_driver.kbuild.devcontainer import extract_developer_container
from nvidia_driver.kbuild.release import DEVELOPER_CONTAINER_PATHS

pytestmark = pytest.mark.integration

KVER = TEST_RELEASE.kernel.release
HELLO_C = """\
#include <linux/init.h>
#include <linux/module.h>
static int __init hello_init(void) { pr_info("hello\\n"); return 0; }
static void __exit hello_exit(void) { }
module_init(hello_init);
module_exit(hello_exit);
MODULE_LICENSE("GPL");
"""


def fetch(url: str) -> bytes:
    with _open(url) as response:
        return response.read()


def download(url: str, dest: Path) -> Path:
    with _open(url) as response, dest.open("wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    return dest


def _open(url: str) -> http.client.HTTPResponse:
    try:
        return urllib.request.urlopen(url, timeout=60)  # noqa: S310 - our own server
    except urllib.error.HTTPError as error:
        error.close()  # it holds the connection: do not leave it to the garbage collector
        raise


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, check=False)


def gpgv(key: SigningKey, *files: Path) -> subprocess.CompletedProcess[str]:
    return run("gpgv", "--keyring", key.public_keyring, *files)


# --- the release server ----------------------------------------------------------------------


def test_release_server_uses_flatcars_url_layout(
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    server = flatcar_release_server
    base = server.base_url.format(channel="stable")
    assert base == f"{server.url}/stable"
    assert server.url.startswith("http://127.0.0.1:")
    for version in ("9999.2.0", "current"):
        assert (
            fetch(f"{base}/amd64-usr/{version}/{VERSION_TXT}")
            == TEST_RELEASE.version_txt().encode()
        )
    with pytest.raises(urllib.error.HTTPError) as unknown:
        fetch(f"{base}/amd64-usr/4593.2.5/{VERSION_TXT}")
    assert unknown.value.code == 404
    with pytest.raises(urllib.error.HTTPError):
        fetch(server.artifact_url(VERSION_TXT, channel="beta"))


def test_version_txt_has_flatcars_variables(flatcar_release_server: FlatcarReleaseServer) -> None:
    text = fetch(flatcar_release_server.artifact_url(VERSION_TXT)).decode()
    assert text.splitlines() == [
        "FLATCAR_BUILD=9999",
        "FLATCAR_BRANCH=2",
        "FLATCAR_PATCH=0",
        "FLATCAR_VERSION=9999.2.0",
        "FLATCAR_VERSION_ID=9999.2.0",
        'FLATCAR_BUILD_ID="2026-08-11-2350"',
        "FLATCAR_SDK_VERSION=9999.0.0",
    ]


def test_releases_json_lists_the_test_release_as_current_stable(
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    feed = json.loads(fetch(flatcar_release_server.releases_json_url))
    assert feed["current"] == feed["9999.2.0"]
    assert feed["9999.2.0"]["channel"] == "stable"
    assert feed["9999.2.0"]["major_software"]["kernel"] == [TEST_RELEASE.kernel.upstream_version]
    assert set(feed) == {"9999.2.0", "current"}  # the test release alone (fixtures/flatcar.py)
    beta = json.loads(fetch(f"{flatcar_release_server.url}/releases-json/releases-beta.json"))
    assert beta == {}


def test_vmlinuz_and_config_are_the_debian_kernels(
    flatcar_release_server: FlatcarReleaseServer, flatcar_kernel_tree: KernelTree
) -> None:
    vmlinuz = fetch(flatcar_release_server.artifact_url(VMLINUZ))
    assert vmlinuz == flatcar_kernel_tree.vmlinuz.read_bytes()
    assert vmlinuz[0x202:0x206] == b"HdrS"  # a bzImage
    config = fetch(flatcar_release_server.artifact_url(KERNEL_CONFIG)).decode()
    assert "CONFIG_MODULES=y" in config.splitlines()


@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_every_artifact_passes_digests_and_signatures(
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    tmp_path: Path,
    artifact: str,
) -> None:
    url = flatcar_release_server.artifact_url(artifact)
    data = download(url, tmp_path / artifact)
    digests = download(f"{url}.DIGESTS", tmp_path / f"{artifact}.DIGESTS")
    signature = download(f"{url}.sig", tmp_path / f"{artifact}.sig")
    clearsigned = download(f"{url}.DIGESTS.asc", tmp_path / f"{artifact}.DIGESTS.asc")

    sections = parse_digests(digests.read_text())
    assert list(sections) == ["MD5", "SHA1", "SHA512"]
    for algorithm, (hexdigest, name) in sections.items():
        assert name == artifact
        assert hexdigest == file_digest(data, algorithm.lower())
    sha512_lines = f"{sections['SHA512'][0]}  {artifact}\n"
    check = subprocess.run(
        ["sha512sum", "-c", "-"], input=sha512_lines, cwd=tmp_path, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert gpgv(flatcar_signing_key, signature, data).returncode == 0
    assert gpgv(flatcar_signing_key, clearsigned).returncode == 0
    assert flatcar_release_server.request_count(url) == 1


def parse_digests(text: str) -> dict[str, tuple[str, str]]:
    """{"MD5": (hex, name), ...} from a Flatcar DIGESTS file."""
    sections: dict[str, tuple[str, str]] = {}
    lines = text.splitlines()
    for header, entry in zip(lines[::2], lines[1::2], strict=True):
        algorithm = header.removeprefix("# ").removesuffix(" HASH")
        hexdigest, name = entry.split("  ", 1)
        sections[algorithm] = (hexdigest, name)
    return sections


def file_digest(path: Path, algorithm: str) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


# --- injected faults -------------------------------------------------------------------------


def test_injected_not_found(flatcar_release_server: FlatcarReleaseServer) -> None:
    url = flatcar_release_server.artifact_url(KERNEL_CONFIG)
    flatcar_release_server.inject(url, Fault.NOT_FOUND)
    with pytest.raises(urllib.error.HTTPError) as error:
        fetch(url)
    assert error.value.code == 404
    assert flatcar_release_server.request_count(url) == 1


def test_injected_corruption_keeps_the_length(
    flatcar_release_server: FlatcarReleaseServer, flatcar_release_artifacts: ReleaseArtifacts
) -> None:
    url = flatcar_release_server.artifact_url(KERNEL_CONFIG)
    flatcar_release_server.inject(url, Fault.CORRUPT)
    body = fetch(url)
    original = flatcar_release_artifacts.path(KERNEL_CONFIG).read_bytes()
    assert len(body) == len(original)
    assert body != original


def test_injected_truncation_breaks_the_transfer(
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    url = flatcar_release_server.artifact_url(VMLINUZ)
    flatcar_release_server.inject(url, Fault.TRUNCATE)
    with pytest.raises(http.client.IncompleteRead):
        fetch(url)


def test_a_fault_injected_for_one_request_heals(
    flatcar_release_server: FlatcarReleaseServer, flatcar_release_artifacts: ReleaseArtifacts
) -> None:
    url = flatcar_release_server.artifact_url(VMLINUZ)
    flatcar_release_server.inject(url, Fault.TRUNCATE, times=1)
    with pytest.raises(http.client.IncompleteRead):
        fetch(url)
    assert fetch(url) == flatcar_release_artifacts.path(VMLINUZ).read_bytes()
    assert flatcar_release_server.request_count(url) == 2


@pytest.mark.parametrize("suffix", [".sig", ".DIGESTS.asc"])
def test_injected_bad_signature_fails_gpgv(
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
    tmp_path: Path,
    suffix: str,
) -> None:
    url = flatcar_release_server.artifact_url(VERSION_TXT)
    flatcar_release_server.inject(url + suffix, Fault.BAD_SIGNATURE)
    data = download(url, tmp_path / VERSION_TXT)
    signature = download(url + suffix, tmp_path / f"{VERSION_TXT}{suffix}")
    files = [signature, data] if suffix == ".sig" else [signature]
    result = gpgv(flatcar_signing_key, *files)
    assert result.returncode != 0
    assert "BAD signature" in result.stderr


def test_bad_signature_only_applies_to_signatures(
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    with pytest.raises(ValueError, match="not a signature"):
        flatcar_release_server.inject(
            flatcar_release_server.artifact_url(VMLINUZ), Fault.BAD_SIGNATURE
        )


def test_faults_and_counts_are_cleared_between_tests(
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    url = flatcar_release_server.artifact_url(KERNEL_CONFIG)
    assert flatcar_release_server.request_count(url) == 0  # earlier tests fetched it, broken
    fetch(url)


# --- flatcar-container.tar.gz ----------------------------------------------------------------


@pytest.fixture(scope="module")
def container_root(
    flatcar_release_artifacts: ReleaseArtifacts, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The parts of the tarball a module build uses: the kernel's directory and the libraries.

    GNU tar and gzip: two processes, where tarfile decompresses and writes on one core."""
    root = tmp_path_factory.mktemp("flatcar-container")
    wanted = (f"./usr/lib/modules/{KVER}", "./usr/lib64")
    tarball = flatcar_release_artifacts.path(CONTAINER_TARBALL)
    tar = run("tar", "--extract", "--gzip", "--file", tarball, "--directory", root, *wanted)
    assert tar.returncode == 0, tar.stderr
    return root


def test_container_tarball_has_flatcars_member_names(
    flatcar_release_artifacts: ReleaseArtifacts,
) -> None:
    with tarfile.open(flatcar_release_artifacts.path(CONTAINER_TARBALL)) as tar:
        names = set(tar.getnames())
    build = f"./usr/lib/modules/{KVER}/build"
    for member in (".config", "Module.symvers", "Makefile", "System.map", "scripts/mod/modpost",
                   "tools/objtool/objtool", "include/generated/utsrelease.h",
                   "arch/x86/include/generated/asm/orc_hash.h"):  # fmt: skip
        assert f"{build}/{member}" in names
    assert "./usr/share/flatcar/release" in names
    assert {"./usr/lib64/ld-linux-x86-64.so.2", "./usr/lib64/libc.so.6"} <= names


def test_container_tarball_is_a_whole_root_around_the_kernel(
    flatcar_release_artifacts: ReleaseArtifacts,
) -> None:
    with tarfile.open(flatcar_release_artifacts.path(CONTAINER_TARBALL)) as tar:
        members = tar.getmembers()
    names = {member.name: member for member in members}
    # A root file system, Gentoo's library layout, and the kernel's own modules beside the tree.
    assert {"./usr/bin/bash", "./etc/os-release", "./usr/lib64/libelf.so.1"} <= names.keys()
    assert names["./lib64"].linkname == "usr/lib64"
    assert any(name.startswith(f"./usr/lib/modules/{KVER}/kernel/") for name in names)
    # What a build takes is a minority of the archive, as in Flatcar's.
    tree = f"./usr/lib/modules/{KVER}/build/"
    tree_bytes = sum(member.size for member in members if member.name.startswith(tree))
    assert tree_bytes < sum(member.size for member in members) / 3


def test_container_tree_is_flatcar_shaped(container_root: Path) -> None:
    modules = container_root / "usr" / "lib" / "modules" / KVER
    assert (modules / "build").is_dir()
    assert not (modules / "build").is_symlink()
    assert (modules / "source").readlink() == Path("build")
    assert not (modules / "build" / ".kernelvariables").exists()
    assert (modules / "modules.dep").is_file()
    assert not list((modules / "build").rglob("*.real-*"))  # Debian's cross-build dispatchers
    release = (modules / "build" / "include" / "config" / "kernel.release").read_text()
    assert release.strip() == KVER


def test_container_tools_run_on_the_bundled_libraries(container_root: Path) -> None:
    loader = container_root / "usr" / "lib64" / "ld-linux-x86-64.so.2"
    libdir = container_root / "usr" / "lib64"
    build = container_root / "usr" / "lib" / "modules" / KVER / "build"
    for tool in ("scripts/basic/fixdep", "scripts/mod/modpost", "tools/objtool/objtool",
                 "scripts/sign-file"):  # fmt: skip
        listing = run(loader, "--library-path", libdir, "--list", build / tool)
        assert listing.returncode == 0, listing.stderr
        resolved = [line.split("=>")[1].split()[0] for line in listing.stdout.splitlines()
                    if "=>" in line]  # fmt: skip
        assert resolved
        assert all(path.startswith(f"{libdir}/") for path in resolved), listing.stdout


def test_hello_module_builds_against_the_container_tree(
    container_root: Path,
    invoke: Invoke,
    build_image: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    """With the kernel's gcc-14, in the build image (the tree's tools need trixie's glibc)."""
    module = write_hello_module(tmp_path / "hello")
    build = container_root / "usr" / "lib" / "modules" / KVER / "build"
    [hello] = kbuild_module_in_image(invoke.build_reference, build, module, "gcc-14")
    vermagic = run("modinfo", "-F", "vermagic", hello).stdout
    assert vermagic.startswith(f"{KVER} SMP ")


def write_hello_module(directory: Path) -> Path:
    directory.mkdir()
    (directory / "hello.c").write_text(HELLO_C)
    (directory / "Kbuild").write_text("obj-m := hello.o\n")
    return directory


# --- flatcar_developer_container.bin.bz2 -----------------------------------------------------


@pytest.fixture(scope="module")
def developer_disk(
    flatcar_release_artifacts: ReleaseArtifacts, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The decompressed disk, kept sparse like ``lbzcat | cp --sparse=always`` does (lbzip2:
    on every core, where Python's bz2 takes one; the artifact's fixture installed it)."""
    disk = tmp_path_factory.mktemp("devcontainer") / "flatcar_developer_container.bin"
    compressed = flatcar_release_artifacts.path(DEVELOPER_CONTAINER)
    with (
        subprocess.Popen(["lbzip2", "-d", "-c", compressed], stdout=subprocess.PIPE) as lbzcat,
        disk.open("wb") as out,
    ):
        stream = lbzcat.stdout
        assert stream is not None
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            if chunk.count(0) == len(chunk):
                out.seek(len(chunk), os.SEEK_CUR)
            else:
                out.write(chunk)
        out.truncate()
    assert lbzcat.returncode == 0, f"lbzip2 -d exited {lbzcat.returncode}"
    return disk


@pytest.fixture(scope="module")
def root_partition(developer_disk: Path) -> Iterator[Path]:
    """Partition 9 copied out of the disk, as a file debugfs and e2fsck can read."""
    (partition,) = read_gpt(developer_disk)
    image = developer_disk.with_name("root.ext4")
    with developer_disk.open("rb") as disk, image.open("wb") as out:
        disk.seek(partition.offset)
        remaining = partition.size
        while remaining:
            chunk = disk.read(min(1 << 20, remaining))
            out.write(chunk)
            remaining -= len(chunk)
    yield image
    image.unlink()


def test_developer_container_is_a_gpt_disk_with_root_at_2_mib(developer_disk: Path) -> None:
    partitions: list[Partition] = read_gpt(developer_disk)
    assert [(p.number, p.name, p.type_guid) for p in partitions] == [
        (ROOT_PARTITION, ROOT_LABEL, LINUX_FILESYSTEM)
    ]
    assert partitions[0].first_lba == ROOT_FIRST_LBA
    assert partitions[0].offset == 2 * 1024 * 1024
    assert developer_disk.stat().st_size % SECTOR == 0


def test_partitioning_tools_read_the_disk(developer_disk: Path) -> None:
    ensure_packages(["gdisk", "fdisk"])
    sgdisk = run("sgdisk", "-v", "-p", developer_disk)
    assert sgdisk.returncode == 0, sgdisk.stderr
    assert "No problems found" in sgdisk.stdout
    (row,) = [line.split() for line in sgdisk.stdout.splitlines() if line.strip().startswith("9 ")]
    assert row[1] == str(ROOT_FIRST_LBA)
    assert row[-1] == ROOT_LABEL
    fdisk = run("fdisk", "-l", developer_disk)
    assert fdisk.returncode == 0, fdisk.stderr
    assert "Disklabel type: gpt" in fdisk.stdout
    assert "Linux filesystem" in fdisk.stdout


def test_root_partition_is_a_clean_ext4_labelled_root(root_partition: Path) -> None:
    fsck = run("e2fsck", "-f", "-n", root_partition)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    stats = run("debugfs", "-R", "stats", root_partition).stdout
    assert "Filesystem volume name:   ROOT" in stats


def test_root_partition_holds_gcc_and_the_kernel_tree(root_partition: Path) -> None:
    usr_bin = run("debugfs", "-R", "ls -l /usr/bin", root_partition)
    assert usr_bin.returncode == 0, usr_bin.stderr
    names = {line.split()[-1] for line in usr_bin.stdout.splitlines() if line.strip()}
    assert {"gcc", "gcc-14", "make", "pahole"} <= names  # trixie's gcc, which built the kernel
    config = run("debugfs", "-R", f"cat /usr/lib/modules/{KVER}/build/.config", root_partition)
    assert "CONFIG_MODULES=y" in config.stdout.splitlines()
    release = run("debugfs", "-R", "cat /usr/share/flatcar/release", root_partition).stdout
    assert "FLATCAR_RELEASE_VERSION=9999.2.0" in release


def test_hello_module_builds_inside_the_developer_container(
    flatcar_release_artifacts: ReleaseArtifacts, tmp_path: Path
) -> None:
    """Extracted as the entrypoint extracts it (partx, debugfs, the tree settled)."""
    compressed = flatcar_release_artifacts.path(DEVELOPER_CONTAINER)
    root = extract_developer_container(
        compressed, tmp_path / "root", DEVELOPER_CONTAINER_PATHS, Commands()
    )
    assert (root / "usr/bin").is_dir()
    assert (root / "bin").readlink() == Path("usr/bin")  # trixie's merged /usr, as Flatcar's
    # The entrypoint provides /dev (release.py); kbuild only needs /dev/null.
    (root / "dev").mkdir()
    os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (root / "tmp").mkdir()  # not extracted: where the module is built here
    write_hello_module(root / "tmp" / "hello")
    build = f"/usr/lib/modules/{KVER}/build"
    result = run("chroot", root, "make", "-C", build, "M=/tmp/hello", "modules")
    assert result.returncode == 0, result.stdout + result.stderr
    vermagic = run("chroot", root, "modinfo", "-F", "vermagic", "/tmp/hello/hello.ko").stdout
    assert vermagic.startswith(f"{KVER} SMP ")


# --- the cache -------------------------------------------------------------------------------


def test_second_build_reuses_the_cache(
    flatcar_release_artifacts: ReleaseArtifacts, flatcar_kernel_tree: KernelTree
) -> None:
    before = {name: flatcar_release_artifacts.path(name).stat().st_mtime_ns for name in ARTIFACTS}
    again = build_release_artifacts(TEST_RELEASE, flatcar_kernel_tree)
    assert again.directory == flatcar_release_artifacts.directory
    assert {name: again.path(name).stat().st_mtime_ns for name in ARTIFACTS} == before
