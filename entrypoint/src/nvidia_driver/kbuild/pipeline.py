"""The one build pipeline: target -> banner -> a cached package, or else tree -> compiler ->
patches -> make -> package.

``init``, ``load`` and ``build`` on a node build for the kernel the node runs; ``build
--flatcar-version`` builds for any release, as the precompiled images are built. Each enters
:meth:`Pipeline.package` once; only the :class:`Target` differs:

* banner: the node's /proc/version, or the release's, read from its vmlinuz (release.py);
* cached package: on a node the image's own packages first, then the cache's, by the module
  sources digest (build.module_sources_digest), its files checked against their recorded
  SHA-256s (a damaged one is built again). A precompiled image's build finds there the
  packages of the image it replaces (images/precompiled/Dockerfile, SEED_IMAGE);
* tree: the node's own (hosttree.py), else the release's (release.py), with a compiler of the
  kernel's gcc major (compiler.py); build.py then patches, makes and packages into the cache;
* afterwards a node's work directory is emptied; a release build keeps it for the next one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, overload

from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.build import BuildRequest, ModuleSources, build_package, module_sources
from nvidia_driver.kbuild.cachedirs import cache_dir, clear_work, work_dir
from nvidia_driver.kbuild.compiler import Compiler
from nvidia_driver.kbuild.hosttools import ForeignToolsError
from nvidia_driver.kbuild.hosttree import host_tree
from nvidia_driver.kbuild.kerneltree import KernelTree
from nvidia_driver.kbuild.packages import Package, matching_package, no_match_reason, report_match
from nvidia_driver.kbuild.release import FlatcarReleases, refuse_foreign_host_tools
from nvidia_driver.log import say, warn
from nvidia_driver.naming import banner_release
from nvidia_driver.paths import Paths


@dataclass(frozen=True)
class RunningKernel:
    """The kernel of the node this runs on."""

    banner: str  # /proc/version
    release: str  # uname -r


@dataclass(frozen=True)
class Target:
    """What one package is built for.

    With ``running``, the kernel of this node: its own build tree comes first, the image's own
    packages count, and the work directory is emptied afterwards. Without, the kernel of the
    Flatcar release ``flatcar_version``.
    """

    flatcar_version: str  # "" on a node whose os-release names none
    running: RunningKernel | None = None
    ofa_kernel: Path | None = None  # MOFED's tree: nvidia-peermem is built against it


@dataclass
class Pipeline:
    """Finds or builds the packages of one driver and module type.

    What a build depends on is worked out once and handed down: the kernel release from the
    banner, the module sources with their patches and digest (for the cache, then the
    build), the tree, and the compiler with the kernel's .config (release.with_compiler).
    """

    paths: Paths
    commands: Commands
    config: DriverConfig
    module_type: str

    @property
    def cache(self) -> Path:
        return cache_dir(self.paths.build_cache, self.commands.env)

    @property
    def work(self) -> Path:
        return work_dir(self.paths.work_cache, self.commands.env)

    @property
    def driver_sources(self) -> Path:
        """/usr/src/nvidia-<version>: the module sources, and the core objects of packages."""
        return self.paths.driver_sources(self.config.driver_version)

    @cached_property
    def releases(self) -> FlatcarReleases:
        """Flatcar's release server: made when first needed, as a node may need none."""
        return FlatcarReleases.from_env(self.commands, self.cache, self.work, self.commands.env)

    @overload
    def package(self, target: Target, *, build: Literal[True] = ...) -> Package: ...
    @overload
    def package(self, target: Target, *, build: bool) -> Package | None: ...

    def package(self, target: Target, *, build: bool = True) -> Package | None:
        """A package for target: a cached one, else (with build) one built now."""
        banner = self.banner(target)
        say("Checking NVIDIA driver packages...")
        if target.ofa_kernel is not None:
            ofa = target.ofa_kernel
            say(f"GPUDirect RDMA with MOFED's {ofa}: nvidia-peermem is built against it")
        precompiled = self.precompiled(target, banner)
        if precompiled is not None:
            return report_match(precompiled)
        kernel = self.kernel_release(target, banner)
        sources = self.module_sources(target, kernel)
        cached = self.cached(banner, sources)
        if cached is not None or not build:
            return report_match(cached)
        return self.build(target, banner, kernel, sources)

    def banner(self, target: Target) -> str:
        if target.running is not None:
            return target.running.banner
        banner = self.releases.banner(target.flatcar_version, self.config.target_arch)
        say(f"Kernel of Flatcar {target.flatcar_version}: {banner}")
        return banner

    def kernel_release(self, target: Target, banner: str) -> str:
        return target.running.release if target.running is not None else banner_release(banner)

    def matching(self, target: Target, banner: str) -> Package | None:
        """The image's package for this kernel, else one cached from this image's sources."""
        precompiled = self.precompiled(target, banner)
        if precompiled is not None:
            return precompiled
        kernel = self.kernel_release(target, banner)
        return self.cached(banner, self.module_sources(target, kernel))

    def precompiled(self, target: Target, banner: str) -> Package | None:
        """The image's own package for this node's kernel.

        The image's own packages were built from its sources: the banner is enough. None is
        built against this node's MOFED. A damaged one (a file changed on the node's disk) is
        none: its install would fail the checksum at every restart, where a build serves.
        """
        if target.running is None or target.ofa_kernel is not None:
            return None
        version = self.config.driver_version
        package = matching_package([self.paths.precompiled], banner, version, self.module_type,
                                   self.driver_sources)  # fmt: skip
        return None if package is None or package.damaged_file() else package

    def why_not_precompiled(self, target: Target, banner: str) -> str:
        """Why the image's own packages do not serve this node, in one phrase."""
        if target.ofa_kernel is not None:
            return "the node runs MOFED: nvidia-peermem is built against its ofa_kernel"
        return no_match_reason([self.paths.precompiled], banner, self.config.driver_version,
                               self.module_type, self.driver_sources)  # fmt: skip

    def cached(self, banner: str, sources: ModuleSources) -> Package | None:
        """The cache's package for this kernel, built from exactly these module sources."""
        version = self.config.driver_version
        cached = matching_package([self.cache / "packages"], banner, version, self.module_type,
                                  self.driver_sources, source_digest=sources.digest)  # fmt: skip
        if cached is None:
            return None
        damaged = cached.damaged_file()
        if damaged is not None:  # a cache heals: the build writes a new package in its place
            warn(f"cached package {cached.path} is damaged ({damaged} is missing or does not "
                 "match its SHA-256): building it again")  # fmt: skip
            return None
        return cached

    def module_sources(self, target: Target, kernel: str) -> ModuleSources:
        """What a build for this kernel compiles, with the digest the cache keys on."""
        return module_sources(
            self.driver_sources,
            self.module_type,
            self.config.driver_branch,
            kernel,
            target.ofa_kernel,
        )

    def build(self, target: Target, banner: str, kernel: str, sources: ModuleSources) -> Package:
        """tree -> compiler -> patches -> make -> package, into the cache."""
        if target.running is not None:
            why = self.why_not_precompiled(target, banner)
            say(f"No precompiled NVIDIA driver package matches kernel {kernel} ({why}); "
                "building one")  # fmt: skip
        releases = self.releases
        try:
            tree = self.tree(target, kernel)
            tree, compiler = releases.with_compiler(
                tree, target.flatcar_version, self.config.target_arch
            )
            return self.compile(target, banner, tree, compiler, sources)
        finally:
            if target.running is not None:
                clear_work(self.work)  # the node's disk: its trees and downloads are not kept

    def tree(self, target: Target, kernel: str) -> KernelTree:
        """The node's own build tree if it has one, else its release's."""
        version, arch = target.flatcar_version, self.config.target_arch
        if version:  # before anything is copied or fetched
            refuse_foreign_host_tools(version, arch)
        if target.running is None:
            return self.releases.tree(version, arch, kernel)
        try:
            tree = host_tree(self.paths, kernel, self.work / "trees" / f"host-{kernel}")
        except ForeignToolsError as foreign:
            if not version:
                raise
            warn(f"{foreign}; using the kernel build tree of Flatcar {version} instead")
            tree = None
        if tree is None:
            if not version:
                raise DriverError(
                    f"no kernel build tree for {kernel}: the host has none and its os-release "
                    "names no VERSION_ID to fetch one for"
                )
            tree = self.releases.tree(version, arch, kernel)
        return tree

    def compile(
        self,
        target: Target,
        banner: str,
        tree: KernelTree,
        compiler: Compiler,
        sources: ModuleSources,
    ) -> Package:
        """Compile and package for one exact kernel banner, into the package cache."""
        banner_key = hashlib.sha256(banner.encode()).hexdigest()[:12]
        if target.ofa_kernel is not None:  # another package: nvidia-peermem built against MOFED
            banner_key += "-mofed"
        version = self.config.driver_version
        request = BuildRequest(
            driver_version=version,
            module_type=self.module_type,
            kernel_release=tree.kernel_release,
            banner=banner,
            tree=tree,
            compiler=compiler,
            module_sources=sources,
            output=self.cache
            / "packages"
            / version
            / self.module_type
            / f"{tree.kernel_release}-{banner_key}",
            log_dir=self.cache / "logs",
            jobs=self.config.max_threads,
            flatcar_version=target.flatcar_version,
            scratch=self.work / "builds",
        )
        return build_package(request, self.commands)
