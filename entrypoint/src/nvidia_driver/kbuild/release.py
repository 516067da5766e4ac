"""Kernel banners and build trees for any Flatcar release, from its release server.

Everything is verified (DIGESTS and signature, see sources/fetch.py). Banners go to the cache,
downloads, trees and developer containers to the work directory (cachedirs.py lays both out),
each under a key derived from the artifact's versioned URL: release artifacts never change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_driver.atomic import replacing, write_atomically
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.vmlinuz import kernel_banner_from_file
from nvidia_driver.kbuild.compiler import (
    Compiler,
    CompilerMismatchError,
    Toolchain,
    choose_compiler,
    kernel_config,
)
from nvidia_driver.kbuild.container import extract_container_tree
from nvidia_driver.kbuild.crossbuild import build_target
from nvidia_driver.kbuild.devcontainer import developer_container_tree, extract_developer_container
from nvidia_driver.kbuild.kerneltree import CONTAINER_TARBALL, KernelTree, one_line
from nvidia_driver.log import say
from nvidia_driver.sources.download import Downloader, DownloadLimits
from nvidia_driver.sources.fetch import Fetcher
from nvidia_driver.sources.flatcar import (
    RELEASE_FILE,
    Artifact,
    ReleaseServer,
    check_release_file,
    has_container_tree,
    has_native_host_tools,
    release_server_from_env,
)
from nvidia_driver.sources.verify import Trust

# What a chrooted build needs from the developer container: gcc, binutils, make, their
# libraries and the kernel's build tree (under usr/lib/modules).
DEVELOPER_CONTAINER_PATHS = [
    "bin", "sbin", "lib", "lib64", "etc",
    "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "usr/libexec", "usr/include",
    "usr/x86_64-cros-linux-gnu", "usr/aarch64-cros-linux-gnu",
    RELEASE_FILE,  # which release it is, checked once unpacked
]  # fmt: skip
_DEVICES = {"null": (1, 3), "zero": (1, 5), "urandom": (1, 9)}


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:24]


def refuse_foreign_host_tools(version: str, arch: str) -> None:
    """One line for a node whose every kernel tree carries another architecture's tools."""
    if not has_native_host_tools(version, arch):
        raise DriverError(
            f"Flatcar {version} on {arch} cannot build kernel modules: its kernel build tree "
            "carries x86-64 host tools (fixdep, modpost), as every arm64 release before "
            "4230.1.0 does, and its developer container has the same tree; update the node to "
            "Flatcar 4230.1.0 or later (stable 4230.2.0, LTS from 4230.3.0), for which this "
            "image builds, or for which a precompiled image exists"
        )


def _provide_devices(root: Path) -> None:
    """gcc and make write to /dev/null; a developer container unpacked from disk has no /dev."""
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    for name, (major, minor) in _DEVICES.items():
        node = dev / name
        if not node.exists():
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))


@dataclass
class FlatcarReleases:
    """What Flatcar releases offer a module build, fetched from their release server."""

    commands: Commands
    cache: Path  # small results worth keeping: banners
    work: Path  # large transient material: downloads, trees, developer containers
    server: ReleaseServer = field(default_factory=ReleaseServer)
    fetcher: Fetcher = field(init=False)
    trust: Trust = field(default_factory=Trust)
    limits: DownloadLimits = field(default_factory=DownloadLimits)

    def __post_init__(self) -> None:
        downloader = Downloader(self.limits)
        self.fetcher = Fetcher(self.work / "downloads", self.commands, self.trust, downloader)

    @classmethod
    def from_env(
        cls, commands: Commands, cache: Path, work: Path, env: Mapping[str, str]
    ) -> FlatcarReleases:
        return cls(
            commands,
            cache,
            work,
            server=release_server_from_env(env),
            trust=Trust.from_env(env),
            limits=DownloadLimits.from_env(env),
        )

    def url(self, version: str, arch: str, artifact: Artifact) -> str:
        return self.server.artifact_url(version, arch, artifact)

    def fetch(self, url: str) -> Path:
        """The verified download of url; a disk filling up under it is one line (the fetcher
        lets the OSError of a write through)."""
        downloads = self.fetcher.cache_dir
        with one_line(f"download {url} into {downloads}", downloads, "retry"):
            return self.fetcher.fetch(url)

    def banner(self, version: str, arch: str) -> str:
        """The exact /proc/version of the release's kernel, read from its vmlinuz."""
        url = self.url(version, arch, Artifact.KERNEL_IMAGE)
        cached = self.cache / "banners" / _key(url)
        if cached.is_file():
            return cached.read_text().rstrip("\n")
        say(f"Reading the kernel banner of Flatcar {version} ({arch})...")
        banner = kernel_banner_from_file(self.fetch(url), commands=self.commands)
        write_atomically(cached, banner + "\n")
        return banner

    def container_tree(self, version: str, arch: str, kernel_release: str) -> KernelTree:
        """The build tree from flatcar-container.tar.gz, streamed: it never lands whole."""
        url = self.url(version, arch, Artifact.CONTAINER_TARBALL)
        final = self.work / "trees" / _key(url)
        if (final / "usr/lib/modules" / kernel_release / "build/Makefile").is_file():
            if _of_release(final, version, arch, url):
                say(f"Using the cached kernel build tree of Flatcar {version} in {final}")
                return _tree_in(final, kernel_release)
            say(f"The cached tree in {final} does not name its release; fetching it again")
        # Extracted beside its final place and published only once the stream has verified
        # and the verified tree says it is this release's.
        with replacing(final) as staged:
            # Entered by the extraction: nothing is followed in the tree before the verdict.
            extract_container_tree(self.fetcher.stream(url), staged, kernel_release)
            check_release_file(staged, version, arch, url)
        return _tree_in(final, kernel_release)

    def developer_container(self, version: str, arch: str, kernel_release: str) -> KernelTree:
        """The release's developer container, unpacked: its gcc built the kernel."""
        url = self.url(version, arch, Artifact.DEVELOPER_CONTAINER)
        root = self.work / "devcontainers" / _key(url)
        complete = root / "usr/lib/modules" / kernel_release / "build/Makefile"
        if not (complete.is_file() and _of_release(root, version, arch, url)):
            image = self.fetch(url)
            say(f"Unpacking the developer container of Flatcar {version}...")
            extract_developer_container(image, root, DEVELOPER_CONTAINER_PATHS, self.commands)
            try:
                check_release_file(root, version, arch, url)
            except DriverError:
                # Verified bytes of another release: keep neither them nor their URL record.
                shutil.rmtree(root, ignore_errors=True)
                self.fetcher.forget(url)
                raise
        _provide_devices(root)
        return developer_container_tree(root, kernel_release)

    def tree(self, version: str, arch: str, kernel_release: str) -> KernelTree:
        """The cheapest complete build tree the release offers, once refuse_foreign_host_tools
        has let it through."""
        if has_container_tree(version):
            return self.container_tree(version, arch, kernel_release)
        say(
            f"Flatcar {version} predates install-extmod-build trees (4230.1.0): using the "
            "kernel build tree of its developer container"
        )
        return self.developer_container(version, arch, kernel_release)

    def with_compiler(
        self, tree: KernelTree, version: str, arch: str
    ) -> tuple[KernelTree, Compiler]:
        """The tree and a gcc of its kernel's major for arch: this image's (or, for a developer
        container's tree, the container's), else the release's developer container's, which
        then comes with the container's tree. The kernel's .config is read here, once."""
        config = kernel_config(tree.build_dir)
        target = build_target(config, arch)
        try:
            return tree, choose_compiler(config, self.commands, Toolchain(tree.toolchain_root),
                                         target)  # fmt: skip
        except CompilerMismatchError as mismatch:
            if tree.toolchain_root is not None or not version:
                raise
            say(f"{mismatch}; using the developer container of Flatcar {version}")
            try:
                container = self.developer_container(version, arch, tree.kernel_release)
            except DriverError as unavailable:
                raise CompilerMismatchError(
                    f"{mismatch} (the developer container is unavailable: {unavailable})"
                ) from unavailable
        toolchain = Toolchain(container.toolchain_root)
        return container, choose_compiler(config, self.commands, toolchain, target)


def _of_release(root: Path, version: str, arch: str, url: str) -> bool:
    try:
        check_release_file(root, version, arch, url)
    except DriverError:
        return False
    return True


def _tree_in(root: Path, kernel_release: str) -> KernelTree:
    modules = root / "usr/lib/modules" / kernel_release
    source = modules / "source"
    return KernelTree(
        build_dir=modules / "build",
        source_dir=source if source.is_dir() else modules / "build",
        kernel_release=kernel_release,
        toolchain_root=None,
        origin=CONTAINER_TARBALL,
    )
