"""The build image has the compiler of every live Flatcar kernel, and uses the kernel's own.

Each test runs the runtime build (``nvidia-driver build`` for the node, what ``init`` runs when
no package matches) inside the session's build image, for a simulated node whose own kernel tree
is copied from its host root (fixtures/image_node.py):

a tree made with Flatcar's config by gcc 15, as Flatcar 4628 and later ship (see
fixtures/gcc15_kernel.py): built with the image's gcc-15, and refused with the compiler mismatch
line when the image offers only gcc-14.

The gcc-14 case (Flatcar 4230.1.0 to 4593) is the test release itself: Debian trixie's 6.12.117
kernel, past the 6.12.97 pci_resize_resource change. The precompiled image builds its packages
with the build image's gcc-14 and the patch (test_images.py), and its open nvidia.ko is insmod-ed
into that kernel under QEMU, where it must stop at "NVRM: No NVIDIA GPU found"
(test_qemu_harness.py, test_images.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures import gcc15_kernel
from fixtures.flatcar import TestRelease
from fixtures.image_node import ImageBuild, Node, build_in_image
from fixtures.images import Invoke
from fixtures.kernel import TRIXIE_KERNEL

pytestmark = pytest.mark.integration

# A beta release as 4757.1.0 is (gcc 15.2.1), around the test trees.
GCC15_RELEASE = TestRelease(version="9999.1.0", channel="beta", kernel=TRIXIE_KERNEL)
PATCH = "pci-resize-resource-exclude-bars"
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
