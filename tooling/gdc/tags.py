"""Image tags, as the GPU Operator computes the image it pulls.

The Operator appends ``-<ID><VERSION_ID>`` (``-flatcar4593.2.0``) to ``driver.version``, and for
precompiled drivers asks for ``<driver.version>-<kernel>-flatcar<VERSION_ID>`` with the kernel
in ``uname -r`` form. So:

* a precompiled image (one per kernel, see :mod:`gdc.matrix`) is tagged ``<driver>-flatcar<V>``
  for each release V it carries (the Operator's default path, with ``driver.version=<driver>``)
  and ``<branch>-<kernel>-flatcar<A>`` for every covered release A and every release a stream's
  current one superseded (``usePrecompiled``, with ``driver.version=<branch>``: A is the first
  GPU node's release, not the pulling node's);
* the build image is tagged ``<driver>-flatcar``, plus ``<driver>-flatcar-flatcar<V>`` for each
  supported release, so that ``driver.version=<driver>-flatcar`` resolves on every node.

An optional prefix (``flatcar-test-<sha8>``) goes in front of every tag, as NVIDIA's dev builds do.
The Operator's formulas live in the entrypoint, which the reboot gate shares them with
(:mod:`nvidia_driver.sources.gpuoperator`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gdc.versions import driver_branch
from nvidia_driver.formats.oci import REPOSITORY, TAG
from nvidia_driver.naming import FLATCAR_VERSION_RE
from nvidia_driver.sources import gpuoperator
from nvidia_driver.sources.gpuoperator import OS_ID, kernel_in_tag

DEFAULT_IMAGE = "driver"  # the Operator's default driver.image
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class Variant(StrEnum):
    BUILD = "build"
    PRECOMPILED = "precompiled"


class TagError(ValueError):
    """A tag that a registry would refuse."""


def os_tag(flatcar_version: str) -> str:
    """``4593.2.0`` -> ``flatcar4593.2.0``: ID + VERSION_ID, never shortened for Flatcar."""
    if not FLATCAR_VERSION_RE.fullmatch(flatcar_version):
        raise TagError(f"invalid Flatcar version {flatcar_version!r}: expected e.g. 4593.2.0")
    return gpuoperator.os_tag(flatcar_version)


def ci_prefix(env: Mapping[str, str]) -> str:
    """The tag prefix of a CI build: ``flatcar-test-<sha8>`` on a branch, none on a release tag.

    Read from GitHub Actions' GITHUB_REF_TYPE and GITHUB_SHA.
    """
    if env.get("GITHUB_REF_TYPE") == "tag":
        return ""
    sha = env.get("GITHUB_SHA", "")
    if not re.fullmatch(r"[0-9a-f]{8,40}", sha):
        raise TagError(
            "--ci-prefix needs GITHUB_SHA (a commit id) and GITHUB_REF_TYPE from GitHub "
            "Actions; outside CI, pass --prefix instead"
        )
    return f"flatcar-test-{sha[:8]}"


def _prefixed(prefix: str, tag: str) -> str:
    if prefix and not _PREFIX.fullmatch(prefix):
        raise TagError(f"invalid tag prefix {prefix!r}: use letters, digits, '_', '.' and '-'")
    full = f"{prefix.rstrip('-')}-{tag}" if prefix else tag
    if not TAG.fullmatch(full):
        raise TagError(f"invalid tag {full!r}: at most 128 of [A-Za-z0-9_.-], not starting '.-'")
    return full


def build_image_tags(
    driver_version: str, flatcar_versions: Iterable[str], prefix: str = ""
) -> tuple[str, ...]:
    """``<driver>-flatcar`` then one ``<driver>-flatcar-flatcar<V>`` alias per release."""
    driver_branch(driver_version)  # validates
    base = gpuoperator.build_image_version(driver_version)
    aliases = [_driver_tag(base, version) for version in dict.fromkeys(flatcar_versions)]
    return tuple(_prefixed(prefix, tag) for tag in (base, *aliases))


def precompiled_tags(
    driver_version: str,
    flatcar_versions: Iterable[str],
    kernel_release: str,
    os_versions: Iterable[str] = (),
    prefix: str = "",
) -> tuple[str, ...]:
    """``<driver>-flatcar<V>`` per release V carried, ``<branch>-<kernel>-flatcar<A>`` per A.

    The second kind is for every release A in flatcar_versions and os_versions: the OS tag the
    Operator puts there is the first GPU node's, whatever release the pulling node runs.
    """
    branch = driver_branch(driver_version)
    carried = list(dict.fromkeys(flatcar_versions))
    by_kernel = list(dict.fromkeys([*os_versions, *carried]))
    tags = [_driver_tag(driver_version, version) for version in carried]
    tags += [_precompiled_tag(branch, kernel_release, version) for version in by_kernel]
    return tuple(_prefixed(prefix, tag) for tag in tags)


def _driver_tag(version: str, flatcar_version: str) -> str:
    os_tag(flatcar_version)  # validates, with the tooling's message
    return gpuoperator.driver_tag(version, flatcar_version)


def _precompiled_tag(version: str, kernel_release: str, flatcar_version: str) -> str:
    os_tag(flatcar_version)  # validates
    return gpuoperator.precompiled_tag(version, kernel_release, flatcar_version)


def staging_tag(driver_version: str, kernel_release: str, arch: str, prefix: str = "") -> str:
    """``<driver>-flatcar-<arch>`` or ``<driver>-<kernel>-<arch>``: one arch, before merging.

    No tag the Operator composes ends in an arch, so these never shadow one.
    """
    driver_branch(driver_version)  # validates
    middle = kernel_in_tag(kernel_release) if kernel_release else OS_ID
    return _prefixed(prefix, f"{driver_version}-{middle}-{arch}")


def repository(registry: str, image: str = DEFAULT_IMAGE) -> str:
    """``<registry>/<image>`` as the Operator joins driver.repository and driver.image.

    Lower-cased: registries refuse upper case in repository names, GitHub owners have it.
    """
    return (f"{registry.rstrip('/')}/{image}" if registry else image).lower()


def check_repository(registry: str, image: str = DEFAULT_IMAGE) -> str:
    """``<registry>/<image>`` if it is a valid repository name, else a TagError saying why."""
    joined = repository(registry, image)
    if not REPOSITORY.fullmatch(joined) or len(joined) > 255:  # noqa: PLR2004 - its limit
        what = f"--registry {registry!r}" if registry else f"--image {image!r}"
        raise TagError(
            f"{what} is not a valid repository (host[:port]/path, path of lower-case letters, "
            "digits and . _ -): e.g. ghcr.io/my-org or 127.0.0.1:5000/gdc; a placeholder such "
            "as <owner> must be replaced"
        )
    return joined


@dataclass(frozen=True)
class ImageTags:
    """Every reference one built image gets; ``primary`` is the one builds refer to."""

    repository: str
    tags: tuple[str, ...]

    @property
    def primary(self) -> str:
        return f"{self.repository}:{self.tags[0]}"

    @property
    def references(self) -> tuple[str, ...]:
        return tuple(f"{self.repository}:{tag}" for tag in self.tags)
