"""The QEMU harness proves a module loads into the kernel it was built for, and catches one that
was not.

The test release's kernel (Debian trixie's 6.12.117 cloud kernel) boots under QEMU (TCG, no
GPU) once for the session (conftest.py, ``release_kernel_boot``) with three modules: NVIDIA's
open nvidia.ko as the precompiled image compiled it (the build image's gcc-14, the release's
container tarball), which must get as far as probing PCI and refuse with "NVRM: No NVIDIA GPU
found" and ENODEV, never "Invalid module format" or "Unknown symbol"; and two controls that keep
the harness honest: a hello-world module built against the same kernel's tree loads, and the
same module built against bookworm's stock 6.1 kernel is refused as an invalid module format.
(What the image's build proves about the package itself is in test_images.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.qemu import DEFAULT_KERNEL, BootResult, debian_kernel, load_order
from fixtures.qemu import modinfo as module_info

from nvidia_driver.kbuild.packages import Package

pytestmark = pytest.mark.integration


def test_nvidia_open_module_is_built_for_the_booted_kernel(
    precompiled_open_package: Package,
) -> None:
    (vermagic,) = module_info(precompiled_open_package.path / "nvidia.ko")["vermagic"]
    assert vermagic.startswith(f"{DEFAULT_KERNEL} ")


def test_nvidia_open_module_loads_until_it_finds_no_gpu(
    release_kernel_boot: BootResult, precompiled_open_package: Package
) -> None:
    boot = release_kernel_boot
    load = boot.load(precompiled_open_package.path / "nvidia.ko")
    assert "NVRM: No NVIDIA GPU found" in load.kernel_log, boot.console
    assert load.errno_name == "ENODEV", boot.console
    assert "No such device" in load.message


def test_nvidia_open_module_has_no_format_or_symbol_errors(
    release_kernel_boot: BootResult, precompiled_open_package: Package
) -> None:
    boot = release_kernel_boot
    load = boot.load(precompiled_open_package.path / "nvidia.ko")
    output = f"{load.message}\n{load.kernel_log}".lower()
    for refusal in ("invalid module format", "unknown symbol", "disagrees about version"):
        assert refusal not in output, boot.console


def test_module_for_the_booted_kernel_loads(
    release_kernel_boot: BootResult, hello_for_release_kernel: Path
) -> None:
    load = release_kernel_boot.load(hello_for_release_kernel)
    assert load.loaded, release_kernel_boot.console
    assert "gdc-hello: loaded" in load.kernel_log


def test_module_for_another_kernel_is_refused_as_invalid_format(
    release_kernel_boot: BootResult, hello_for_other_kernel: Path
) -> None:
    load = release_kernel_boot.load(hello_for_other_kernel)
    assert load.errno_name == "ENOEXEC", release_kernel_boot.console
    # busybox spells kmod's "Invalid module format" in lower case.
    assert "invalid module format" in load.message.lower()


def test_vm_powers_off_after_the_last_module(release_kernel_boot: BootResult) -> None:
    assert release_kernel_boot.finished
    assert "reboot: Power down" in release_kernel_boot.console


def test_load_order_puts_dependencies_first(precompiled_open_package: Package) -> None:
    nvidia = precompiled_open_package.path / "nvidia.ko"
    uvm = precompiled_open_package.path / "nvidia-uvm.ko"
    assert module_info(uvm)["depends"] == ["nvidia"]
    assert load_order([uvm, nvidia], debian_kernel()) == [nvidia, uvm]


def test_load_order_keeps_two_builds_of_one_module(
    hello_for_other_kernel: Path, hello_for_release_kernel: Path
) -> None:
    modules = [hello_for_other_kernel, hello_for_release_kernel]
    assert load_order(modules, debian_kernel()) == modules
