"""The image the NVIDIA GPU Operator pulls for a Flatcar node, as its code composes the tag.

Read from NVIDIA/gpu-operator (a22dbf6):

* ClusterPolicy (``controllers/object_controls.go`` ``resolveDriverTag``): the image is
  ``<repository>/<image>:<version>`` (``<repository>/<image>@<version>`` for a ``sha256:``
  digest, to which nothing is appended), and ``-<osTag>`` is appended; with ``usePrecompiled``
  ``-<kernel>`` goes in between. osTag is ``ID`` + ``VERSION_ID`` of the first GPU node it
  lists (``state_manager.go`` ``getGPUNodeOSInfo``), the kernel each per-kernel DaemonSet's
  (``precompiledDriverDaemonsets``, from the ``kernel-version.full`` label).
* NVIDIADriver (``api/nvidia/v1alpha1/nvidiadriver_types.go`` ``GetImagePath``,
  ``GetPrecompiledImagePath``; ``internal/state/nodepool.go``): the same shapes, with the osTag
  and kernel of each node pool's own nodes.

The Operator shortens ``VERSION_ID`` to its major only for rhel, rocky and ol (``getOSTag``):
Flatcar's tag carries the full version. The tooling (``gdc.tags``) names the images it
publishes with these functions, and the reboot gate (``nvidia_driver.gate``) the images it
checks for.
"""

from __future__ import annotations

import re

from nvidia_driver.sources.flatcar import FlatcarVersion

OS_ID = "flatcar"  # /etc/os-release ID, as NFD's system-os_release.ID label carries it
DIGEST_PREFIX = "sha256:"  # a version the Operator takes as a digest: nothing is appended
_NOT_IN_TAG = re.compile(r"[^A-Za-z0-9_.-]")


def os_tag(flatcar_version: str) -> str:
    """``4593.2.0`` -> ``flatcar4593.2.0``: ID + VERSION_ID, never shortened for Flatcar."""
    return f"{OS_ID}{FlatcarVersion.parse(flatcar_version)}"


def kernel_in_tag(kernel_release: str) -> str:
    """The kernel as a tag can hold it: characters a tag may not contain become ``-``.

    A Flatcar kernel (``6.12.81-flatcar``) is a valid tag part as it is, which is what the
    Operator puts there.
    """
    return _NOT_IN_TAG.sub("-", kernel_release)


def driver_tag(version: str, flatcar_version: str) -> str:
    """The default mode's tag: ``<version>-flatcar<VERSION_ID>``."""
    return f"{version}-{os_tag(flatcar_version)}"


def precompiled_tag(version: str, kernel_release: str, flatcar_version: str) -> str:
    """The ``usePrecompiled`` tag: ``<version>-<kernel>-flatcar<VERSION_ID>``."""
    return f"{version}-{kernel_in_tag(kernel_release)}-{os_tag(flatcar_version)}"


def build_image_version(driver_version: str) -> str:
    """``610.57.04`` -> ``610.57.04-flatcar``: the build image's tag, and the ``driver.version``
    that makes the Operator ask for its per-release alias ``610.57.04-flatcar-flatcar<V>``."""
    return f"{driver_version}-{OS_ID}"
