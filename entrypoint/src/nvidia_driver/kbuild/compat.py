"""Which driver branches build on which kernels: the kernel changes that broke old branches.

A kernel change that an old driver branch does not handle stops its build until a
compatibility patch (``patches/index.json``, :mod:`nvidia_driver.kbuild.patches`) bridges it.
From which kernel a change breaks comes from the patch index (the lowest ``min_kernel`` of the
patches named for it); which branches it breaks, and from which branch NVIDIA's own sources
handle it, is said here. The tooling leaves such pairs out of what it publishes
(``gdc.matrix``); the reboot gate holds a reboot into such a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.patches import select_patches, shipped_patches
from nvidia_driver.naming import parse_kernel_release


@dataclass(frozen=True)
class KernelBreak:
    """A kernel change that old driver branches need a compatibility patch for."""

    patch: str  # the patch's name in patches/index.json
    tree: str  # the source tree it breaks: kernel-open or kernel
    fixed_in_branch: int  # the first branch whose own sources handle the change


KERNEL_BREAKS = (
    # Linux 6.12.97 gave pci_resize_resource() a 4th argument; NVIDIA's sources handle it from
    # 580 on, Flatcar patches 535, 550 and 570 (flatcar/scripts a08a106, fa087c4).
    KernelBreak("pci-resize-resource-exclude-bars", "kernel-open", 580),
)


def break_since(kernel_break: KernelBreak) -> str:
    """The first kernel the change breaks: the lowest min_kernel of its patches."""
    kernels = [patch.min_kernel for patch in shipped_patches() if patch.name == kernel_break.patch]
    if not kernels:
        raise DriverError(
            f"nvidia_driver.kbuild.compat.KERNEL_BREAKS names patch {kernel_break.patch!r}, "
            "which patches/index.json does not list: fix the name"
        )
    return str(min(kernels))


def build_problem(driver: str, kernel_release: str) -> str:
    """Why the modules of driver (a version, or a branch such as ``580``) do not build for the
    kernel, or "" when they should."""
    branch = int(driver.split(".", 1)[0])
    kernel = parse_kernel_release(kernel_release)
    for kernel_break in KERNEL_BREAKS:
        since = break_since(kernel_break)
        if branch >= kernel_break.fixed_in_branch or kernel < parse_kernel_release(since):
            continue
        selected = select_patches(branch, kernel_release, kernel_break.tree)
        if any(patch.name == kernel_break.patch for patch in selected):
            continue
        return (
            f"driver {driver} {kernel_break.tree} does not build on kernel "
            f"{kernel_release}: it needs patch {kernel_break.patch} (kernels from {since}; "
            f"fixed by NVIDIA from branch {kernel_break.fixed_in_branch}) and "
            f"entrypoint/src/nvidia_driver/kbuild/patches/index.json has none for branch {branch}; "
            "add one or drop the driver"
        )
    return ""
