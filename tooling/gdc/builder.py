"""The builder ``invoke publish`` uses: one arch at a time, with ``invoke build``'s code.

Each build is the classic builder's, for this machine's arch (CI runs one job per arch on a
native runner), tagged with the image's staging tag and pushed; :mod:`gdc.publish` merges the
arches afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gdc import context, images
from gdc.docker_api import Docker, DockerError, Progress
from gdc.images import Base
from gdc.matrix import Image, Matrix
from gdc.plan import BuildSettings, Request
from gdc.publish import BuildError
from gdc.tags import Variant
from gdc.text import first_line
from gdc.versions import VersionsError


@dataclass
class DockerBuilder:
    """Builds through dockerd, connected on the first build (or unpinned base image) only.

    dry_run: plan without dockerd at all; an unpinned base image then has no known digest
    (publish says so per image) instead of being looked up.
    """

    settings: BuildSettings
    matrix: Matrix
    connect: Callable[[bool], Docker]  # multi-arch? -> the Docker adapter
    progress: Progress
    scratch: Path  # where the build contexts are laid out, once each
    dry_run: bool = False
    _contexts: dict[Variant, context.Context] = field(default_factory=dict)
    _docker: Docker | None = None
    _bases: dict[str, Base] = field(default_factory=dict)

    def docker(self) -> Docker:
        if self._docker is None:
            self._docker = self.connect(False)  # noqa: FBT003 - one arch per build
        return self._docker

    def context(self, variant: Variant) -> context.Context:
        if variant not in self._contexts:
            self._contexts[variant] = context.assemble(
                variant, self.scratch / variant.value, self.settings.upstream.keyring
            )
        return self._contexts[variant]

    def request(self, image: Image, arch: str) -> Request:
        carried = image.platform(arch).releases
        release = carried[0].release if carried else self.matrix.releases[0].release
        return Request(image.variant, image.driver, release, image.aliases, (arch,),
                       tuple(c.version for c in carried), settings=self.settings)  # fmt: skip

    def base(self, image: Image, arch: str) -> Base:  # noqa: ARG002 - one base for every arch
        reference = self.settings.upstream.base_image or images.default_base_image()
        if reference not in self._bases:
            known = images.pinned_base(reference) or (Base(reference, "") if self.dry_run else None)
            try:
                self._bases[reference] = known or images.base_of(reference, self.docker())
            except DockerError as exc:
                raise BuildError(str(exc)) from None
        return self._bases[reference]

    def inputs(self, image: Image, arch: str, base: Base) -> dict[str, str]:
        request = self.request(image, arch)
        try:
            if image.variant is Variant.BUILD:
                return images.build_inputs(request, self.context(Variant.BUILD), base)
            return images.precompiled_inputs(request, self.context(Variant.PRECOMPILED), base)
        except VersionsError as exc:
            raise BuildError(str(exc)) from None

    def build(self, image: Image, arch: str, base: Base, previous: str = "") -> None:
        request = self.request(image, arch)
        reference = f"{image.tags.repository}:{image.staging_tag(arch)}"
        docker = self.docker()
        try:
            if image.variant is Variant.BUILD:
                job = images.build_job(request, self.context(Variant.BUILD), base, (reference,))
            else:
                job = images.precompiled_job(request, self.context(Variant.PRECOMPILED), base,
                                             (reference,), seed=previous)  # fmt: skip
            self.progress(f"Building {reference}\n")
            docker.build(job, self.progress)
            if image.variant is Variant.PRECOMPILED:
                kernel = images.kernel_of(docker, reference)
                if kernel != image.kernel:
                    raise BuildError(f"the packages built are for kernel {kernel}, the releases "
                                     f"feed says {image.kernel}: check the feed")  # fmt: skip
            self.progress(f"Pushing {reference}\n")
            docker.push(reference, self.progress)
        except (DockerError, VersionsError) as exc:
            raise BuildError(first_line(exc)) from None
