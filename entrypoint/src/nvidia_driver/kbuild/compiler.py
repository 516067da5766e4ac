"""The compiler a build uses: a gcc of the kernel's major version, in this image or chrooted.

The kernel's .config names the gcc that built it; a module built by another major may not load
(or may not build). Where the image lacks it, the release's developer container has it: the
build then runs chrooted there (Toolchain). A tree for another architecture than this machine's
takes the cross gcc of that major (crossbuild.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.crossbuild import BuildTarget, build_target, missing_cross_compiler

CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Toolchain:
    """Where compilers run: in this image, or chrooted into a developer container."""

    root: Path | None = None

    def argv(self, name: str, *args: str | Path) -> tuple[str, list[str | Path]]:
        if self.root is None:
            return name, list(args)
        # Inside the chroot, this image's PATH means nothing: use the container's own.
        return "chroot", [self.root, "/usr/bin/env", f"PATH={CHROOT_PATH}", name, *args]

    def inside(self, path: Path) -> Path:
        """``path`` as the compiler sees it."""
        return path if self.root is None else Path("/") / path.relative_to(self.root)

    def has(self, name: str, commands: Commands) -> bool:
        if self.root is None:
            return commands.which(name) is not None
        return any((self.root / prefix / name).exists() for prefix in ("usr/bin", "bin"))

    def describe(self) -> str:
        return "this image" if self.root is None else f"the developer container at {self.root}"


def kernel_config(build_dir: Path) -> dict[str, str]:
    """The kernel's configuration, from the build tree's .config (none if it has none)."""
    config: dict[str, str] = {}
    try:
        text = (build_dir / ".config").read_text(errors="replace")
    except OSError:
        return config
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            key, value = line.split("=", 1)
            config[key] = value.strip().strip('"')
    return config


def kernel_gcc_major(config: Mapping[str, str]) -> int | None:
    """The major version of the gcc that built the kernel, from its .config (kernel_config)."""
    version = config.get("CONFIG_GCC_VERSION", "")
    if re.fullmatch(r"[0-9]{1,8}", version) and int(version) > 0:
        return int(version) // 10000
    return gcc_major_of(config.get("CONFIG_CC_VERSION_TEXT", ""))


def gcc_major_of(version_text: str) -> int | None:
    """The gcc major of a compiler's version text: CONFIG_CC_VERSION_TEXT, which the kernel's
    banner carries too ("... (x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1 p4) 14.3.1
    20250801, GNU ld ...)", scripts/mkcompile_h)."""
    match = re.search(r"gcc[^)]*\)\s+([0-9]+)\.", version_text)
    return int(match.group(1)) if match else None


def _compiler_output(commands: Commands, toolchain: Toolchain, *argv: str) -> str:
    program, args = toolchain.argv(*argv)
    return commands.run(program, *args).stdout.strip()


class CompilerMismatchError(DriverError):
    """No gcc of the kernel's major version where the build would run."""


@dataclass(frozen=True)
class Compiler:
    """The gcc a build compiles with, where it runs, and the architecture it compiles for."""

    command: str  # gcc-14, or a cross build's aarch64-linux-gnu-gcc-14
    version: str  # its --version line, which the package records
    toolchain: Toolchain
    target: BuildTarget


def choose_compiler(
    config: Mapping[str, str],
    commands: Commands,
    toolchain: Toolchain = Toolchain(),
    target: BuildTarget | None = None,
) -> Compiler:
    """A gcc of the kernel's major version (config: the kernel's .config), for the kernel's
    architecture: a tree for another one than this machine's takes the cross gcc."""
    wanted = kernel_gcc_major(config)
    target = target or build_target(config)
    prefix = target.prefix
    candidates = [f"{prefix}gcc-{wanted}", f"{prefix}gcc"] if wanted else [f"{prefix}gcc"]
    seen = []
    for name in candidates:
        if not toolchain.has(name, commands):
            continue
        number = _compiler_output(commands, toolchain, name, "-dumpfullversion", "-dumpversion")
        seen.append(f"{name} {number}")
        if wanted is None or number.split(".", 1)[0] == str(wanted):
            banner = _compiler_output(commands, toolchain, name, "--version").splitlines()[0]
            return Compiler(name, banner, toolchain, target)
    available = ", ".join(seen) or "none"
    if target.cross:  # no developer container helps: its gcc is the target's, not this machine's
        raise missing_cross_compiler(target, wanted, available)
    raise CompilerMismatchError(
        f"the kernel was built with gcc {wanted} and no gcc {wanted} is available in "
        f"{toolchain.describe()} (found: {available}); use an image that carries gcc-{wanted} "
        "or build with the release's developer container"
    )
