"""Choosing where a release's kernel tree and compiler come from."""

from __future__ import annotations

from pathlib import Path

import pytest
from simhost import SimulatedHost

from nvidia_driver.commands import Commands
from nvidia_driver.kbuild.cachedirs import cache_dir
from nvidia_driver.kbuild.compiler import (
    CHROOT_PATH,
    CompilerMismatchError,
    Toolchain,
    choose_compiler,
    kernel_config,
)
from nvidia_driver.settings import NVIDIA_DRIVER_CACHE_DIR
from nvidia_driver.sources.flatcar import has_container_tree


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("4081.3.10", False),  # LTS 2024: the old build/source layout, developer container
        ("4230.2.4", True),
        ("4230.1.0", True),
        ("4186.0.0", False),
        ("4277.0.0", True),
        ("4593.2.5", True),
        ("4790.0.0", True),
    ],
)
def test_which_releases_carry_a_tree_in_their_container_tarball(
    version: str, expected: bool
) -> None:
    assert has_container_tree(version) is expected


def test_the_cache_directory_is_configurable(tmp_path: Path) -> None:
    default = tmp_path / "run" / "nvidia" / "cache"
    assert cache_dir(default, {}) == default
    assert cache_dir(default, {NVIDIA_DRIVER_CACHE_DIR: "/var/cache/nvidia"}) == Path(
        "/var/cache/nvidia"
    )


def test_a_developer_container_build_runs_chrooted(tmp_path: Path) -> None:
    root = tmp_path / "devcontainer"
    toolchain = Toolchain(root)
    assert toolchain.argv("make", "-C", "/var/tmp/x") == (
        "chroot",
        [root, "/usr/bin/env", f"PATH={CHROOT_PATH}", "make", "-C", "/var/tmp/x"],
    )
    assert toolchain.inside(root / "usr/lib/modules/k/build") == Path("/usr/lib/modules/k/build")
    assert Toolchain().inside(root) == root


def test_the_compiler_must_match_the_kernels_major_version(host: SimulatedHost) -> None:
    tree = host.add_host_kernel_tree(gcc=140201)
    commands = Commands(host.env())
    compiler = choose_compiler(kernel_config(tree), commands)
    assert (compiler.command, compiler.version) == ("gcc-14", "gcc-14 (Debian 14.2.0-19) 14.2.0")
    tree = host.add_host_kernel_tree(gcc=130301)
    with pytest.raises(CompilerMismatchError) as caught:
        choose_compiler(kernel_config(tree), commands)
    assert str(caught.value).startswith(
        "the kernel was built with gcc 13 and no gcc 13 is available in this image"
    )


def test_the_developer_containers_gcc_is_looked_for_inside_it(
    host: SimulatedHost, tmp_path: Path
) -> None:
    tree = host.add_host_kernel_tree(gcc=120200)
    root = tmp_path / "devcontainer"
    with pytest.raises(CompilerMismatchError, match="in the developer container at"):
        choose_compiler(kernel_config(tree), Commands(host.env()), Toolchain(root))
