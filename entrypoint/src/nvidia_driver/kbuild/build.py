"""Compile NVIDIA's module sources against a kernel build tree (patches applied, ``make modules``
with the chosen compiler) and package the result as a kernel interface package (packages.py).

The tree, its compiler and the module sources come ready from pipeline.py.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.commands import Commands, lines
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.compiler import Compiler, Toolchain
from nvidia_driver.kbuild.kerneltree import (
    KernelTree,
    missing_symbol_versions,
    one_line,
    tells_of_full_disk,
)
from nvidia_driver.kbuild.modules import OPEN, SOURCE_DIRS
from nvidia_driver.kbuild.packages import (
    LinkedModule,
    Package,
    PackageMetadata,
    package_name,
    sha256_file,
    write_package,
)
from nvidia_driver.kbuild.patches import Patch, apply_patches, select_patches
from nvidia_driver.log import say, warn

# Modules whose closed core must not be redistributed linked: (module, interface, core object).
_CLOSED_CORES = (
    ("nvidia.ko", "nvidia/nv-interface.o", "nvidia/nv-kernel.o_binary"),
    (
        "nvidia-modeset.ko",
        "nvidia-modeset/nv-modeset-interface.o",
        "nvidia-modeset/nv-modeset-kernel.o_binary",
    ),
)
_BAR_WIDTH = 30
_COMPILE_LINE = re.compile(r"^\s+CC \[M\]\s")
_ERROR_LINE = re.compile(r"(error:|Error \d+|\*\*\*)")


@dataclass(frozen=True)
class ModuleSources:
    """What a build compiles, and its digest (:func:`module_sources_digest`), which the
    package records and the cache keys on."""

    directory: Path  # kernel/ or kernel-open/ of /usr/src/nvidia-<version>
    patches: tuple[Patch, ...]  # the compatibility patches this kernel needs, in order
    digest: str
    # MOFED's tree for this kernel: nvidia-peermem is built against it (node/peermem.py).
    ofa_kernel: Path | None = None


@dataclass(frozen=True)
class BuildRequest:
    driver_version: str
    module_type: str
    kernel_release: str
    banner: str
    tree: KernelTree
    compiler: Compiler  # a gcc of the kernel's major, for the tree (release.with_compiler)
    module_sources: ModuleSources
    output: Path  # the package directory to create
    log_dir: Path
    jobs: int = 0
    flatcar_version: str = ""
    # Where the compile runs (a copy of the sources and its objects, hundreds of MB): on disk,
    # not beside the package in /run. None: beside the output.
    scratch: Path | None = None


def tree_digest(paths: Iterable[Path], suffix: str = "") -> str:
    """A digest of every file's path and bytes under ``paths`` (only names ending in suffix)."""
    digest = hashlib.sha256()
    for root in paths:
        files = (p for p in root.rglob(f"*{suffix}") if p.is_file())
        for file in sorted(files):
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return f"sha256:{digest.hexdigest()}"


def module_sources(
    driver_sources: Path,
    module_type: str,
    driver_branch: int,
    kernel_release: str,
    ofa_kernel: Path | None = None,
) -> ModuleSources:
    """What a build for this kernel compiles: the module type's sources in ``driver_sources``
    (/usr/src/nvidia-<version>), the patches this kernel needs, MOFED's tree if any."""
    directory = driver_sources / SOURCE_DIRS[module_type]
    patches = tuple(select_patches(driver_branch, kernel_release, directory.name))
    digest = module_sources_digest(directory, patches, ofa_kernel)
    return ModuleSources(directory, patches, digest, ofa_kernel)


@functools.cache
def build_code_digest() -> str:
    """A digest of the code that turns sources into a package: this kbuild package's modules.

    A package is reused (from a node's cache, or from the image a precompiled one replaces)
    only if the same code built it; any change here, even one that changes no flag, makes
    the next build compile again, which is the safe side.
    """
    return tree_digest([Path(__file__).parent], suffix=".py")


def module_sources_digest(
    directory: Path, patches: Iterable[Patch], ofa_kernel: Path | None = None
) -> str:
    """What a package is built from: the module sources, each patch applied, in order, the
    build code (:func:`build_code_digest`), and MOFED's tree when built against it.

    The cache keys on it, so that an image with new sources, patches or build code for the
    same driver version does not reuse packages built from the old ones. About 0.3 s for a
    190 MB tree.
    """
    digest = hashlib.sha256(tree_digest([directory]).encode())
    digest.update(f"\0build code\0{build_code_digest()}".encode())
    for patch in patches:
        digest.update(f"\0{patch.name}\0".encode())
        digest.update(patch.path.read_bytes())
    if ofa_kernel is None:
        return f"sha256:{digest.hexdigest()}"
    # Built against MOFED: the digest of the sources, then MOFED's tree.
    mofed = f"sha256:{digest.hexdigest()}\0ofa_kernel\0{tree_digest([ofa_kernel])}"
    return f"sha256:{hashlib.sha256(mofed.encode()).hexdigest()}"


def strip_debug_info(
    files: Iterable[Path], commands: Commands, toolchain: Toolchain = Toolchain(), prefix: str = ""
) -> bool:
    """Drop the DWARF (most of a module's size) as the kernel's INSTALL_MOD_STRIP=1 does.

    ``--strip-debug`` keeps the symbols, .BTF and the relocations that loading and relinking
    need. The binutils are those the modules were compiled with (``prefix``: a cross build's).
    False if there is no strip.
    """
    strip = f"{prefix}strip"
    if not toolchain.has(strip, commands):
        warn(f"no {strip} in {toolchain.describe()}: packaging the modules with their debug info")
        return False
    program, args = toolchain.argv(
        strip, "--strip-debug", *(toolchain.inside(file) for file in files)
    )
    commands.run(program, *args)
    return True


def module_linker_script(build_dir: Path) -> Path | None:
    """The script kbuild's modfinal links modules with: scripts/module.lds, else the arch's."""
    candidates = [
        build_dir / "scripts" / "module.lds",
        *sorted(build_dir.glob("arch/*/module.lds")),
    ]
    return next((path for path in candidates if path.is_file()), None)


def _progress(done: int, total: int) -> str:
    filled = _BAR_WIDTH * done // max(total, 1)
    percent = 100 * done // max(total, 1)
    return f"  [{'#' * filled}{' ' * (_BAR_WIDTH - filled)}] {percent}%"


# Where MOFED's tree is copied into the build directory: OFA_DIR/default, the last of the
# places nvidia-peermem.Kbuild looks (a copy, so a chrooted compiler sees it too).
OFA_COPY = "ofa_kernel"


def run_make(workdir: Path, request: BuildRequest, commands: Commands) -> Path:
    """Run ``make modules``, showing progress; keep the whole log for a failure."""
    compiler = request.compiler
    toolchain = compiler.toolchain
    request.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = request.log_dir / f"build-{request.kernel_release}-{request.module_type}.log"
    total = sum(1 for _ in workdir.rglob("*.c")) or 1
    jobs = request.jobs or os.cpu_count() or 1
    args: list[str | Path] = [
        "-C",
        toolchain.inside(workdir),
        f"-j{jobs}",
        "modules",
        f"SYSSRC={toolchain.inside(request.tree.source_dir)}",
        f"SYSOUT={toolchain.inside(request.tree.build_dir)}",
        f"CC={compiler.command}",
        # NVIDIA's conftest.sh (cc_version_check) stops the build unless CC's major.minor is
        # the one in the kernel's include/generated/compile.h. choose_compiler has held the
        # build to the kernel's gcc major, what a module's ABI depends on; the minor seldom
        # matches (Flatcar 4593's kernel is built by its SDK's gcc 14.3.1, not Debian's).
        "IGNORE_CC_MISMATCH=1",
        *compiler.target.make_arguments(),
    ]
    if request.module_sources.ofa_kernel is not None:
        args.append(f"OFA_DIR={toolchain.inside(workdir / OFA_COPY)}")
    say("Building kernel modules:")
    compiled, shown = 0, -1
    first_error, disk_full = "", False
    with log_path.open("w") as log, commands.stream(*toolchain.argv("make", *args)) as process:
        for line in lines(process.stdout):
            log.write(line + "\n")
            if _COMPILE_LINE.match(line):
                compiled += 1
            elif not first_error and _ERROR_LINE.search(line):
                first_error = line.strip()
            disk_full = disk_full or tells_of_full_disk(line)
            step = min(10 * compiled // total, 9)
            if step > shown:
                shown = step
                say(_progress(step * total // 10, total))
        returncode = process.wait()
    if returncode != 0:
        # The reason of a full disk may be in the log only, after make's own "*** Error" line.
        full = f"; the disk is full: make room in {workdir.parent} and retry" if disk_full else ""
        raise DriverError(
            f"building the NVIDIA kernel modules failed: {first_error or 'see the log'} "
            f"(full log: {log_path}){full}"
        )
    say(_progress(total, total))
    return log_path


@dataclass(frozen=True)
class PackageFiles:
    """What a build puts in its package, by each file's name in it."""

    files: dict[str, Path]  # copied into the package
    modules: list[str]  # the modules stored linked (.ko)
    linked: list[LinkedModule]  # the proprietary modules, linked on the node
    # NVIDIA's core objects: their path under /usr/src/nvidia-<version>, not copied.
    referenced: dict[str, str]


def _core_reference(workdir: Path, directory: Path, core: str) -> str | None:
    """The core object's path in the driver's sources (``directory`` is kernel/ of
    /usr/src/nvidia-<version>), if the build linked it as the sources hold it."""
    source = directory / core
    if source.is_file() and sha256_file(source) == sha256_file(workdir / core):
        return f"{directory.name}/{core}"
    return None


def _package_files(workdir: Path, module_type: str, directory: Path) -> PackageFiles:
    """The files of the package, its modules, and those linked at install time (the
    proprietary modules' interface objects, and NVIDIA's core objects, referenced in
    ``directory``, the module sources, when they are the ones built with)."""
    built = sorted(path.name for path in workdir.glob("*.ko"))
    if "nvidia.ko" not in built:
        raise DriverError(f"the build produced no nvidia.ko in {workdir}; see the build log")
    files = {name: workdir / name for name in built}
    if module_type == OPEN:
        return PackageFiles(files, built, [], {})
    linked = []
    referenced = {}
    for module, interface, core in _CLOSED_CORES:
        if module not in files:
            continue
        del files[module]
        stem = module.removesuffix(".ko")
        parts = {
            f"{stem}.interface.o": workdir / interface,
            f"{stem}.core.o_binary": workdir / core,
            f"{stem}.mod.o": workdir / f"{stem}.mod.o",
        }
        # Since kernel 6.12 the vermagic lives in .module-common.o, linked in only at modfinal.
        common = workdir / ".module-common.o"
        if common.is_file():
            parts[f"{stem}.module-common.o"] = common
        missing = [str(path) for path in parts.values() if not path.is_file()]
        if missing:
            raise DriverError(f"cannot package {module}: missing {', '.join(missing)}")
        linked.append(LinkedModule(module, list(parts), linker_script="module.lds"))
        reference = _core_reference(workdir, directory, core)
        if reference is not None:
            referenced[f"{stem}.core.o_binary"] = reference
            del parts[f"{stem}.core.o_binary"]
        files.update(parts)
    if linked:
        if not (workdir / "module.lds").is_file():
            raise DriverError(
                "the kernel tree has no module linker script (scripts/module.lds or "
                "arch/<arch>/module.lds) to link the proprietary modules with"
            )
        files["module.lds"] = workdir / "module.lds"
    modules = [name for name in built if name not in {item.module for item in linked}]
    return PackageFiles(files, modules, linked, referenced)


def build_package(request: BuildRequest, commands: Commands) -> Package:
    sources = request.module_sources
    if not (sources.directory / "Makefile").is_file():
        raise DriverError(
            f"no {request.module_type} module sources at {sources.directory}: the image is "
            "incomplete"
        )
    if not (request.tree.build_dir / "Makefile").is_file():
        raise DriverError(f"no kernel build tree at {request.tree.build_dir}")
    symvers = missing_symbol_versions(request.tree.build_dir)
    if symvers is not None:
        raise DriverError(
            f"the kernel build tree has no Module.symvers, or an empty one ({symvers}): modules "
            "built against it cannot resolve the kernel's symbols (a tree only made with "
            "'make modules_prepare' has none); use the tree of a complete kernel build, such as "
            "the release's own"
        )
    # A developer container's tree is built chrooted into it, with the gcc that built the kernel.
    compiler = request.compiler
    toolchain, target = compiler.toolchain, compiler.target
    if target.cross:
        say(f"The kernel is for {target.arch}: {target.describe()}")
    say(f"Compiling NVIDIA driver kernel modules with {compiler.version}...")
    # The compile must see its sources: inside the developer container when chrooted.
    if toolchain.root is not None:
        scratch = toolchain.root / "var" / "tmp"
    else:
        scratch = request.scratch or request.output.parent
    # A disk filling up mid-build (the sources' copy, the objects, the package) is one line
    # that says where to make room; what was written is removed either way.
    what = f"build the modules in {scratch}"
    with one_line(what, scratch, "retry"):
        scratch.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=".build.", dir=scratch))
    try:
        with one_line(what, scratch, "retry"):
            shutil.copytree(sources.directory, workdir, dirs_exist_ok=True, symlinks=True)
            apply_patches(sources.patches, workdir, commands)
            if sources.ofa_kernel is not None:
                shutil.copytree(sources.ofa_kernel, workdir / OFA_COPY / "default", symlinks=True)
            run_make(workdir, request, commands)
            script = module_linker_script(request.tree.build_dir)
            if script is not None:
                shutil.copyfile(script, workdir / "module.lds")
            packaged = _package_files(workdir, request.module_type, sources.directory)
            # Not NVIDIA's closed core objects (.o_binary): they carry no debug info.
            objects = [
                path for name, path in packaged.files.items() if name.endswith((".ko", ".o"))
            ]
            stripped = strip_debug_info(objects, commands, toolchain, target.prefix)
        metadata = PackageMetadata(
            banner=request.banner,
            kernel_release=request.kernel_release,
            driver_version=request.driver_version,
            module_type=request.module_type,
            compiler=compiler.version,
            source_digest=sources.digest,
            modules=packaged.modules,
            linked=packaged.linked,
            referenced=packaged.referenced,
            patches=[patch.name for patch in sources.patches],
            flatcar_version=request.flatcar_version,
            debug_info_stripped=stripped,
        )
        say(f"Building NVIDIA driver package {package_name(request.kernel_release)}...")
        with one_line(f"write the package {request.output}", request.output.parent, "retry"):
            return write_package(request.output, metadata, packaged.files, sources.directory.parent)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
