"""Building for a kernel of another architecture than the build machine's (a cross build).

A kernel tree says which architecture it is for in its ``.config`` (``CONFIG_ARM64``,
``CONFIG_X86_64``). When that is not the machine the build runs on (an arm64 precompiled
package built on an amd64 runner), make gets the kernel's ``ARCH`` and ``CROSS_COMPILE``, and
the compiler and binutils are the cross ones of the kernel's gcc major, as Debian names them:
``aarch64-linux-gnu-gcc-14`` (package ``gcc-14-aarch64-linux-gnu``), ``aarch64-linux-gnu-strip``.
The tree's host tools (fixdep, modpost) still run on the build machine: hosttools.py checks
their ELF machine against it, and refuses a tree whose tools are the target's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvidia_driver.errors import DriverError
from nvidia_driver.naming import KBUILD_ARCH, TRIPLETS, machine_arch

# The kernel config symbol each architecture's trees set, by the architecture names the
# images and TARGETARCH use.
_CONFIG_SYMBOLS = {"CONFIG_X86_64": "amd64", "CONFIG_ARM64": "arm64"}


@dataclass(frozen=True)
class BuildTarget:
    """The architecture a tree is for, and the one the build runs on."""

    arch: str
    machine: str

    @property
    def cross(self) -> bool:
        return self.arch != self.machine

    @property
    def prefix(self) -> str:
        """What comes before gcc, strip and ld: the target's triplet and a dash when cross."""
        return f"{TRIPLETS[self.arch]}-" if self.cross else ""

    def make_arguments(self) -> list[str]:
        if not self.cross:
            return []
        return [f"ARCH={KBUILD_ARCH[self.arch]}", f"CROSS_COMPILE={self.prefix}"]

    def describe(self) -> str:
        return f"cross-building for {self.arch} on this {self.machine} machine"


def tree_arch(config: Mapping[str, str]) -> str | None:
    """The architecture a kernel ``.config`` is for; None when it names none we know."""
    found = [arch for symbol, arch in _CONFIG_SYMBOLS.items() if config.get(symbol) == "y"]
    return found[0] if len(found) == 1 else None


def build_target(config: Mapping[str, str], wanted: str = "") -> BuildTarget:
    """Where this tree's modules run and where they are built.

    ``wanted`` is the architecture asked for (TARGETARCH); a tree for another one is refused.
    A tree whose ``.config`` names no architecture is built as for the build machine.
    """
    machine = machine_arch()
    arch = tree_arch(config)
    if arch is not None and wanted and arch != wanted:
        raise DriverError(
            f"the kernel build tree is for {arch} ({_symbol(arch)}=y in its .config), not for "
            f"{wanted} (TARGETARCH): use the {wanted} release's tree or set TARGETARCH={arch}"
        )
    target = arch or machine
    if target != machine and (target not in TRIPLETS or machine not in TRIPLETS):
        raise DriverError(
            f"cannot cross-build for {target} on this {machine} machine: only "
            f"{', '.join(sorted(TRIPLETS))} are known"
        )
    return BuildTarget(target, machine)


def _symbol(arch: str) -> str:
    return next(symbol for symbol, name in _CONFIG_SYMBOLS.items() if name == arch)


def missing_cross_compiler(target: BuildTarget, wanted: int | None, found: str) -> DriverError:
    """The one line for a cross build without the target's gcc of the kernel's major."""
    version = f"-{wanted}" if wanted else ""
    package = f"gcc{version}-{TRIPLETS[target.arch].replace('_', '-')}"  # gcc-14-x86-64-linux-gnu
    return DriverError(
        f"the kernel was built with gcc {wanted or '(unknown)'} for {target.arch}, and "
        f"{target.describe()} needs {target.prefix}gcc{version} (Debian's {package}), which is "
        f"not on PATH (found: {found}); install it, or build on a {target.arch} machine"
    )
