"""Builds for a tree of another architecture than this machine's: kbuild/crossbuild.py.

The tree's ``.config`` names its architecture (``CONFIG_ARM64=y``, ``CONFIG_X86_64=y``); the
other architecture is the one this machine is not, so the tests hold on an amd64 and on an
arm64 machine alike. The runtime path on an arm64 node is tested in node/test_arm64_node.py.
"""

from __future__ import annotations

import pytest
from simhost import SimulatedHost

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.compiler import choose_compiler, kernel_config
from nvidia_driver.kbuild.crossbuild import build_target, tree_arch
from nvidia_driver.naming import machine_arch

ON_ARM64 = machine_arch() == "arm64"
OTHER_ARCH = "amd64" if ON_ARM64 else "arm64"
OTHER_PREFIX = "x86_64-linux-gnu-" if ON_ARM64 else "aarch64-linux-gnu-"


def test_a_cross_build_without_the_cross_gcc_says_which_package_it_needs(
    host: SimulatedHost,
) -> None:
    tree = host.add_host_kernel_tree(arch=OTHER_ARCH)
    (host.bin_dir / f"{OTHER_PREFIX}gcc-14").unlink()
    with pytest.raises(DriverError) as caught:
        choose_compiler(kernel_config(tree), Commands(host.env()))
    triplet = OTHER_PREFIX.removesuffix("-").replace("_", "-")  # Debian's package names
    assert str(caught.value) == (
        f"the kernel was built with gcc 14 for {OTHER_ARCH}, and cross-building for "
        f"{OTHER_ARCH} on this {machine_arch()} machine needs {OTHER_PREFIX}gcc-14 (Debian's "
        f"gcc-14-{triplet}), which is not on PATH (found: none); install it, or build on a "
        f"{OTHER_ARCH} machine"
    )


def test_the_cross_gcc_of_the_kernels_major_is_chosen(host: SimulatedHost) -> None:
    tree = host.add_host_kernel_tree(arch=OTHER_ARCH)
    compiler = choose_compiler(kernel_config(tree), Commands(host.env()))
    assert compiler.command == f"{OTHER_PREFIX}gcc-14"
    assert compiler.version == f"{OTHER_PREFIX}gcc-14 (Debian 14.2.0-19) 14.2.0"
    assert compiler.target.cross


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"CONFIG_ARM64": "y"}, "arm64"),
        ({"CONFIG_X86_64": "y"}, "amd64"),
        ({"CONFIG_GCC_VERSION": "140200"}, None),
        ({"CONFIG_ARM64": "y", "CONFIG_X86_64": "y"}, None),  # no real tree: not guessed
    ],
)
def test_the_trees_arch_comes_from_its_config(config: dict[str, str], expected: str | None) -> None:
    assert tree_arch(config) == expected


def test_a_native_build_passes_no_cross_arguments() -> None:
    native = build_target({}, OTHER_ARCH)  # a tree naming no arch: the machine's, as before
    assert not native.cross
    assert native.prefix == ""
    assert native.make_arguments() == []
    cross = build_target({"CONFIG_ARM64" if OTHER_ARCH == "arm64" else "CONFIG_X86_64": "y"})
    assert cross.cross
    assert cross.make_arguments() == [
        f"ARCH={'arm64' if OTHER_ARCH == 'arm64' else 'x86_64'}",
        f"CROSS_COMPILE={OTHER_PREFIX}",
    ]
