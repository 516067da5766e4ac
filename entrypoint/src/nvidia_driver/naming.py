"""The project's vocabulary, defined once: architecture names, NVIDIA's file names, and how
driver, Flatcar and kernel versions are spelled (issue 38). The entrypoint and the tooling
import these; tests/unit/test_one_definition.py finds a second copy.

Every grammar is ASCII: ``\\d`` and ``str.isdigit()`` take digits such as "²" or "٣".
"""

from __future__ import annotations

import platform
import re
from typing import NamedTuple

from nvidia_driver.errors import DriverError

# --- architectures ---------------------------------------------------------------------------

ARCHES = ("amd64", "arm64")  # Go's and Docker's names: TARGETARCH, image platforms
# uname -m of each. NVIDIA names its .run (NVIDIA-Linux-x86_64-...) and MOFED its kernel trees
# the same way.
MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}
# Either spelling of an architecture -> Go's (uname -m says arm64 on some arm64 kernels).
ARCH_OF = {**{arch: arch for arch in ARCHES}, **{name: arch for arch, name in MACHINE.items()}}
# GNU triplets: Debian's multiarch library directories and cross toolchains.
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
# ARCH= as NVIDIA's kernel Makefile takes it (it maps x86_64 to the kernel's x86 itself).
KBUILD_ARCH = {"amd64": "x86_64", "arm64": "arm64"}
# The platform redistrib_<V>.json names (linux-x86_64, linux-sbsa).
REDIST_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}


def machine_arch() -> str:
    """This machine's architecture, as Go names it (an unknown one as uname -m does)."""
    machine = platform.machine()
    return ARCH_OF.get(machine, machine)


def arch_of(name: str) -> str:
    """amd64 or arm64 for either spelling of an architecture."""
    try:
        return ARCH_OF[name]
    except KeyError:
        raise DriverError(
            f"unsupported architecture {name!r}: expected one of {', '.join(ARCH_OF)}"
        ) from None


def known_arch(arch: str) -> str:
    """``arch`` if it is amd64 or arm64 (Go's names only)."""
    if arch not in ARCHES:
        raise DriverError(f"unsupported architecture {arch!r}: expected amd64 or arm64")
    return arch


def redist_platform(arch: str) -> str:
    return f"linux-{REDIST_ARCH[arch]}"


# --- NVIDIA's files --------------------------------------------------------------------------


def run_name(version: str, arch: str) -> str:
    """NVIDIA's installer of ``version`` for ``arch``: NVIDIA-Linux-x86_64-580.105.08.run."""
    return f"NVIDIA-Linux-{MACHINE[known_arch(arch)]}-{version}.run"


def driver_url(base_url: str, version: str, arch: str) -> str:
    """The .run under a datacenter base URL (us.download.nvidia.com/tesla): <base>/<V>/<run>."""
    return f"{base_url.rstrip('/')}/{version}/{run_name(version, arch)}"


def redist_manifest_url(base_url: str, version: str) -> str:
    return f"{base_url.rstrip('/')}/redistrib_{version}.json"


# --- driver versions -------------------------------------------------------------------------

DRIVER_BRANCH_RE = re.compile(r"[0-9]{3,}")
# NVIDIA's driver versions: the branch, then one or two numbers: 580.105.08, 575.51.02 (a beta),
# 390.157 (a legacy branch's).
DRIVER_VERSION_RE = re.compile(rf"{DRIVER_BRANCH_RE.pattern}\.[0-9]+(?:\.[0-9]+)?")


def driver_branch(version: str) -> int:
    """``580.105.08`` -> 580: a driver's branch, its major version (the patches, the module
    type and the GPU Operator's precompiled tags go by it)."""
    if not DRIVER_VERSION_RE.fullmatch(version):
        raise DriverError(f"invalid driver version {version!r}: expected e.g. 580.105.08")
    return int(version.split(".", 1)[0])


def driver_key(version: str) -> tuple[int, ...]:
    """A driver version's sort key: 580.105.08 sorts before 580.159.03."""
    return tuple(int(part) for part in version.split("."))


# --- Flatcar versions ------------------------------------------------------------------------

FLATCAR_VERSION_RE = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)")  # MAJOR.MINOR.PATCH: 4593.2.5
# The releases feed's key of an LTS stream's newest release: current-2024.
LTS_STREAM_KEY_RE = re.compile(r"current-([0-9]{4})")

# --- kernels ---------------------------------------------------------------------------------

KERNEL_VERSION_RE = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")  # 6.12.102, or 6.2
# uname -r: the version, then a local version (6.12.102-flatcar, 6.12.95+deb12-cloud-amd64), of
# characters an image tag can carry once "+" becomes "-".
KERNEL_RELEASE_RE = re.compile(rf"{KERNEL_VERSION_RE.pattern}(?:[-+][A-Za-z0-9._+-]*)?")
FLATCAR_KERNEL_SUFFIX = "-flatcar"  # EXTRAVERSION set by the coreos-sources ebuild
# /proc/version's line. A template ("Linux version %s ...", or "... #" without a build number)
# must not match: a kernel image carries those too.
KERNEL_BANNER_RE = re.compile(r"Linux version (?P<release>[^\s%]+) \(.*\) #[0-9]+ ")


class KernelVersion(NamedTuple):
    major: int
    minor: int
    sublevel: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.sublevel}"


def parse_kernel_release(release: str) -> KernelVersion:
    """The version at the start of a release: "6.12.117+deb12-cloud-amd64" is 6.12.117."""
    match = KERNEL_VERSION_RE.match(release.strip())
    if match is None:
        raise DriverError(f"cannot read a kernel version from the kernel release {release!r}")
    major, minor, sublevel = match.groups()
    return KernelVersion(int(major), int(minor), int(sublevel or 0))


def kernel_release_from_feed(kernel: str) -> str:
    """``uname -r`` of a Flatcar release from its releases feed's kernel field.

    Flatcar's feed names the upstream version ("6.12.102"); the running kernel adds the
    ebuild's EXTRAVERSION. A value that already carries a local version (a mirror's feed for
    a custom kernel, "6.12.95+deb12-cloud-amd64") is the full release already.
    """
    return kernel if re.search(r"[-+]", kernel) else kernel + FLATCAR_KERNEL_SUFFIX


def banner_release(banner: str) -> str:
    """The kernel release (uname -r) a banner names."""
    match = KERNEL_BANNER_RE.match(banner)
    if match is None:
        raise DriverError(f"not a kernel banner: {banner[:80]!r}")
    return match["release"]
