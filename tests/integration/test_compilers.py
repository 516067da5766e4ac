"""The build image has the compiler of every live Flatcar kernel, and uses the kernel's own.

Each test runs the runtime build (``nvidia-driver build`` for the node, what ``init`` runs when
no package matches) inside the session's build image, for a simulated node whose own kernel tree
is copied from its host root (fixtures/image_node.py):

* a tree made with Flatcar's config by gcc 15, as Flatcar 4628 and later ship (see
  fixtures/gcc15_kernel.py): built with the image's gcc-15, and refused with the compiler
  mismatch line when the image offers only gcc-14;
* Debian trixie's 6.12.117 cloud kernel, built by gcc 14 with the 6.12.97 pci_resize_resource
  change, as Flatcar 4593 is: built with the image's gcc-14 and the project's patch, then
  insmod'ed into that kernel under QEMU, where nvidia.ko must stop at "NVRM: No NVIDIA GPU found".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures import gcc15_kernel
from fixtures.flatcar import TestRelease
from fixtures.image_node import ImageBuild, Node, build_in_image, bundle_tool_libraries
from fixtures.images import Invoke
from fixtures.kernel import TRIXIE_KERNEL, kernel_tree
from fixtures.qemu import boot_and_insmod

from nvidia_driver.commands import Commands
from nvidia_driver.vmlinuz import kernel_banner_from_file

pytestmark = pytest.mark.integration

# A beta release as 4757.1.0 is (gcc 15.2.1), around the test trees.
GCC15_RELEASE = TestRelease(version="9999.1.0", channel="beta", kernel=TRIXIE_KERNEL)
GCC14_RELEASE = TestRelease(version="9999.2.1", channel="stable", kernel=TRIXIE_KERNEL)
PATCH = "pci-resize-resource-exclude-bars"
NO_GPU = "NVRM: No NVIDIA GPU found"
BROKEN_BUILD = ("Invalid module format", "Unknown symbol")
# Nothing is served there: a developer-container fallback fails at once, as "not found".
NO_RELEASE_SERVER = "file:///nonexistent/{channel}"


def _metadata(build: ImageBuild, module_type: str) -> dict[str, object]:
    assert build.result.returncode == 0, build.log
    loaded = json.loads((build.package_dir(module_type) / "metadata.json").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _comment(module: Path) -> str:
    """The .comment section: the compiler versions that made the object."""
    return subprocess.run(["readelf", "-p", ".comment", str(module)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


@pytest.fixture(scope="session")
def gcc15_node(invoke: Invoke, build_image: subprocess.CompletedProcess[str]) -> Node:
    rootfs = gcc15_kernel.prepared_tree(invoke.build_reference)
    release = gcc15_kernel.kernel_release(rootfs)
    compiler = gcc15_kernel.cc_version_text(rootfs)
    banner = (
        f"Linux version {release} (gdc@localhost) ({compiler}, GNU ld (GNU Binutils for "
        "Debian) 2.47.50.20261021) #1 SMP PREEMPT_DYNAMIC Thu Aug 13 10:26:25 -00 2026"
    )
    return Node(release, banner, GCC15_RELEASE.os_release(), rootfs)


def test_a_gcc15_flatcar_kernel_is_built_for_with_the_images_gcc15(
    invoke: Invoke, gcc15_node: Node, tmp_path: Path
) -> None:
    assert gcc15_kernel.cc_version_text(gcc15_node.rootfs).startswith("gcc-15 (Debian 15.")
    build = build_in_image(invoke.build_reference, gcc15_node, tmp_path, "open")
    metadata = _metadata(build, "open")
    assert "Copying the host's kernel build tree" in build.log
    assert "Compiling NVIDIA driver kernel modules with gcc-15 (Debian 15." in build.log
    assert str(metadata["compiler"]).startswith("gcc-15 (Debian 15.")
    assert metadata["kernel_release"] == gcc15_node.kernel_release
    assert metadata["patches"] == [PATCH]  # 6.12.117 has the 6.12.97 change
    nvidia = build.package_dir("open") / "nvidia.ko"
    assert "GCC: (Debian 15." in _comment(nvidia)
    assert "GCC: (Debian 14." not in _comment(nvidia)


def test_gcc14_in_the_same_image_is_refused_for_a_gcc15_kernel(
    invoke: Invoke, gcc15_node: Node, tmp_path: Path
) -> None:
    """The compiler is chosen by the kernel's gcc major: an image with only gcc-14 says so."""
    build = build_in_image(
        invoke.build_reference, gcc15_node, tmp_path, "open",
        env={"FLATCAR_RELEASE_BASE_URL": NO_RELEASE_SERVER},
        hide=("gcc", "gcc-15", "x86_64-linux-gnu-gcc-15", "cc"), gcc="gcc-14",
    )  # fmt: skip
    assert build.result.returncode == 1, build.log
    [line] = build.result.stderr.strip().splitlines()
    assert line.startswith(
        "ERROR: the kernel was built with gcc 15 and no gcc 15 is available in this image "
        "(found: gcc 14."
    )
    assert "the developer container is unavailable" in line
    assert "Building kernel modules" not in build.log


@pytest.fixture(scope="session")
def gcc14_node(invoke: Invoke, build_image: subprocess.CompletedProcess[str]) -> Node:
    """Trixie's kernel, Flatcar-shaped, its tools' libraries from the build image (its kbuild
    needs a newer glibc than this Debian 12 machine's)."""

    def libraries(rootfs: Path) -> None:
        bundle_tool_libraries(invoke.build_reference, rootfs, gcc15_kernel.TOOL_LIBRARIES)

    tree = kernel_tree(TRIXIE_KERNEL, bundle=("image-libs", libraries))
    banner = kernel_banner_from_file(tree.vmlinuz, commands=Commands())
    return Node(TRIXIE_KERNEL.release, banner, GCC14_RELEASE.os_release(), tree.rootfs)


def test_a_gcc14_kernel_past_6_12_97_builds_in_the_image_and_loads(
    invoke: Invoke, gcc14_node: Node, tmp_path: Path
) -> None:
    build = build_in_image(invoke.build_reference, gcc14_node, tmp_path, "open")
    metadata = _metadata(build, "open")
    assert "Compiling NVIDIA driver kernel modules with gcc-14 (Debian 14." in build.log
    assert metadata["patches"] == [PATCH]
    nvidia = build.package_dir("open") / "nvidia.ko"
    boot = boot_and_insmod([nvidia], TRIXIE_KERNEL.release)
    assert NO_GPU in boot.console
    assert boot.load(nvidia).errno_name == "ENODEV"
    assert not any(error in boot.console for error in BROKEN_BUILD)
    assert metadata["banner"] == boot.proc_version
