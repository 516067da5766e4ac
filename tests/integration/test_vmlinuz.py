"""The kernel banner reader on a real kernel: Debian's, the one the test release serves.

The unit tests read kernel images they compress themselves; this one is Debian's own bzImage
(trixie's cloud kernel), as the release server hands it out as flatcar_production_image.vmlinuz.
"""

from __future__ import annotations

import pytest
from fixtures.kernel import KernelTree

from nvidia_driver.formats.vmlinuz import kernel_banner
from nvidia_driver.naming import banner_release

pytestmark = pytest.mark.integration


def test_the_banner_of_a_real_debian_kernel(flatcar_kernel_tree: KernelTree) -> None:
    release = flatcar_kernel_tree.kernel.release
    image = flatcar_kernel_tree.vmlinuz.read_bytes()
    banner = kernel_banner(image, kernel_release=release, source=flatcar_kernel_tree.vmlinuz.name)
    assert banner.startswith(f"Linux version {release} (")
    assert banner_release(banner) == release
