"""Build, tag, measure and push the two images.

A precompiled build first builds (or finds in the build cache) the build image of the same
driver, then adds one layer on top of it. Its ``<branch>-<kernel>-flatcar<V>`` tag takes the
kernel from the packages inside the built image, not from the feed: the packages are what the
node's kernel has to match. A multi-arch build (buildx) pushes as it builds and so has to use
the feed's kernel.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import takewhile
from pathlib import Path, PurePosixPath

from gdc import context, inputs
from gdc.docker_api import BuildJob, Docker, DockerError, ImageInfo, Progress
from gdc.plan import Request
from gdc.tags import ImageTags, Variant, build_image_tags, precompiled_tags, repository
from nvidia_driver.formats.oci import DIGEST

PRECOMPILED_DIR = "/opt/nvidia/precompiled"
CREATED_LABEL = "org.opencontainers.image.created"
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"
_BASE_ARG = re.compile(r"^ARG BASE_IMAGE=(\S+)$", re.MULTILINE)
_DIGEST = re.compile(rf"@({DIGEST.pattern})$")


@dataclass(frozen=True)
class Base:
    """The image a build starts FROM: its reference and digest (base.name, base.digest)."""

    name: str
    digest: str


def default_base_image() -> str:
    """The build image's pinned base: ARG BASE_IMAGE's default in images/build/Dockerfile."""
    match = _BASE_ARG.search((context.ROOT / "images/build/Dockerfile").read_text())
    if match is None:
        raise DockerError("images/build/Dockerfile has no ARG BASE_IMAGE=<image> default")
    return match.group(1)


def pinned_base(reference: str) -> Base | None:
    """The base a reference pinned by digest names, asking no dockerd; None when unpinned."""
    pinned = _DIGEST.search(reference)
    return Base(reference, pinned.group(1)) if pinned else None


def base_of(reference: str, docker: Docker) -> Base:
    """A reference pinned by digest names its digest; else dockerd's image says it.

    A local image with no registry digest (a test's imported base) is named by its ID.
    """
    pinned = pinned_base(reference)
    if pinned:
        return pinned
    if not docker.exists(reference):
        raise DockerError(f"the base image {reference} is neither pinned by digest nor in "
                          "dockerd: pin it (name@sha256:...) or pull it first")  # fmt: skip
    info = docker.inspect(reference)
    return Base(reference, info.repo_digest or info.id)


def created(commit_time: str) -> str:
    """The commit's time (rebuilding a commit gives the same config); now without one."""
    return commit_time or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(request: Request, base: Base, recorded: dict[str, str]) -> dict[str, str]:
    return {
        inputs.INPUTS_LABEL: inputs.to_label(recorded),
        CREATED_LABEL: created(request.settings.created),
        BASE_NAME_LABEL: base.name,
        BASE_DIGEST_LABEL: base.digest,
    }


@dataclass(frozen=True)
class Built:
    tags: ImageTags
    info: ImageInfo | None  # None for a multi-arch image pushed by buildx


def build_tags(request: Request) -> ImageTags:
    tags = build_image_tags(request.driver.version, request.aliases, request.settings.prefix)
    return ImageTags(_repository(request), tags)


def precompiled_image_tags(request: Request, kernel_release: str) -> ImageTags:
    tags = precompiled_tags(request.driver.version, request.carried, kernel_release,
                            request.os_versions, request.settings.prefix)  # fmt: skip
    return ImageTags(_repository(request), tags)


def _repository(request: Request) -> str:
    return repository(request.settings.registry, request.settings.image)


def planned_tags(request: Request) -> list[ImageTags]:
    """The tags a build of request gets (precompiled: with the feed's kernel)."""
    planned = [build_tags(request)]
    if request.variant is Variant.PRECOMPILED:
        planned.append(precompiled_image_tags(request, request.flatcar.kernel_release))
    return planned


def platforms(request: Request) -> tuple[str, ...]:
    return tuple(f"linux/{arch}" for arch in request.arches)


def _optional(**values: str) -> dict[str, str]:
    """Build arguments left out when empty, so the Dockerfile's defaults apply."""
    return {key: value for key, value in values.items() if value}


def build_args(request: Request) -> dict[str, str]:
    args = {
        "DRIVER_VERSION": request.driver.version,
        "DRIVER_BRANCH": request.driver.branch,
        "DRIVER_SHA256": request.sha256_spec,
        "REDIST_SHA256": request.redist_spec,
        "GIT_COMMIT": request.settings.git_commit,
        "SOURCE_URL": request.settings.source_url,
        "FLATCAR_VERSIONS": " ".join(request.aliases),
        **_optional(
            BASE_IMAGE=request.settings.upstream.base_image,
            DRIVER_BASE_URL=request.settings.upstream.driver_base_url,
            FABRICMANAGER_BASE_URL=request.settings.upstream.fabricmanager_base_url,
        ),
    }
    if not request.multi_arch:
        args["TARGETARCH"] = request.arches[0]  # buildx sets it per platform itself
    return args


def build_inputs(request: Request, ctx: context.Context, base: Base) -> dict[str, str]:
    args = build_args(request)
    return {**inputs.context_digests(ctx.directory), "base": base.digest,
            "driver": f"{request.driver.version} {args['DRIVER_SHA256']}",
            "arguments": inputs.arguments_digest(args)}  # fmt: skip


def build_job(request: Request, ctx: context.Context, base: Base,
              references: tuple[str, ...] = ()) -> BuildJob:  # fmt: skip
    return _job(request, ctx, base, build_args(request), recorded=build_inputs(request, ctx, base),
                references=references or build_tags(request).references)  # fmt: skip


def _job(request: Request, ctx: context.Context, base: Base, args: dict[str, str], *,
         recorded: dict[str, str], references: tuple[str, ...]) -> BuildJob:  # fmt: skip
    return BuildJob(ctx.directory, ctx.dockerfile, args, references, platforms(request),
                    request.settings.network, labels(request, base, recorded))  # fmt: skip


def precompiled_args(request: Request, ctx: context.Context, build_image: str) -> dict[str, str]:
    return {
        "BUILD_IMAGE": build_image,
        "FLATCAR_VERSIONS": " ".join(request.carried),
        **_optional(
            FLATCAR_RELEASE_BASE_URL=request.settings.upstream.release_base_url,
            FLATCAR_KEYRING=ctx.keyring,
        ),
    }


def precompiled_inputs(request: Request, ctx: context.Context, base: Base) -> dict[str, str]:
    args = precompiled_args(request, ctx, base.name)
    return {**inputs.context_digests(ctx.directory), "base": base.digest,
            inputs.RELEASES: " ".join(request.carried),
            "arguments": inputs.arguments_digest(args)}  # fmt: skip


def precompiled_job(request: Request, ctx: context.Context, base: Base,
                    references: tuple[str, ...] = (), seed: str = "") -> BuildJob:  # fmt: skip
    """The build of a precompiled image on base.

    seed: the image it replaces (``repository@sha256:...``), whose packages the build reuses
    where they fit (the Dockerfile's SEED_IMAGE); none: the build image, which has none. It is
    not a build input: the packages a seed gives are those a compile would make.
    """
    tags = precompiled_image_tags(request, request.flatcar.kernel_release)
    # Single-arch: only the kernel-free tag until the image says which kernel it serves.
    default = tags.references if request.multi_arch else tags.references[:1]
    args = {**precompiled_args(request, ctx, base.name), "SEED_IMAGE": seed or base.name}
    return _job(request, ctx, base, args, recorded=precompiled_inputs(request, ctx, base),
                references=references or default)  # fmt: skip


def kernel_of(docker: Docker, reference: str) -> str:
    """The one kernel release the precompiled packages in the image were built for."""
    files = docker.read_files(reference, PRECOMPILED_DIR)
    kernels = {
        json.loads(content)["kernel_release"]
        for path, content in files.items()
        if PurePosixPath(path).name == "metadata.json"
    }
    if len(kernels) != 1:
        found = ", ".join(sorted(kernels)) or "no package"
        raise DockerError(f"{reference}: expected packages for one kernel under "
                          f"{PRECOMPILED_DIR}, found {found}")  # fmt: skip
    return str(kernels.pop())


def build_images(request: Request, docker: Docker, progress: Progress) -> list[Built]:
    """Build what request asks for; return each image with its tags (build image first)."""
    upstream = request.settings.upstream
    with tempfile.TemporaryDirectory(prefix="gdc-context.") as scratch:
        build_ctx = context.assemble(Variant.BUILD, Path(scratch) / "build")
        base = base_of(upstream.base_image or default_base_image(), docker)
        built = [_build(docker, build_job(request, build_ctx, base), build_tags(request),
                        progress)]  # fmt: skip
        if request.variant is Variant.PRECOMPILED:
            ctx = context.assemble(Variant.PRECOMPILED, Path(scratch) / "precompiled",
                                   upstream.keyring)  # fmt: skip
            job = precompiled_job(request, ctx, _built_base(built[0], docker))
            built.append(_build_precompiled(request, docker, job, progress))
    return built


def _built_base(build: Built, docker: Docker) -> Base:
    """The build image a precompiled one starts from: its ID when it was just built here."""
    reference = build.tags.primary
    info = build.info or (docker.inspect(reference) if docker.exists(reference) else None)
    return Base(reference, (info.repo_digest or info.id) if info else "")


def _build(docker: Docker, job: BuildJob, tags: ImageTags, progress: Progress) -> Built:
    progress(f"Building {', '.join(job.references)}\n")
    image_id = docker.build(job, progress)
    return Built(tags, docker.inspect(tags.primary) if image_id else None)


def _build_precompiled(
    request: Request, docker: Docker, job: BuildJob, progress: Progress
) -> Built:
    progress(f"Building {', '.join(job.references)}\n")
    image_id = docker.build(job, progress)
    if not image_id:  # buildx pushed it under the feed's kernel
        return Built(precompiled_image_tags(request, request.flatcar.kernel_release), None)
    kernel = kernel_of(docker, job.references[0])
    tags = precompiled_image_tags(request, kernel)
    for reference in tags.references[1:]:
        docker.tag(image_id, reference)
    return Built(tags, docker.inspect(tags.primary))


def local_images(request: Request, docker: Docker) -> list[Built]:
    """What an earlier build of request left in dockerd (for push)."""
    build = build_tags(request)
    found = [Built(build, _inspect_existing(docker, build.primary))]
    if request.variant is Variant.PRECOMPILED:
        first = precompiled_image_tags(request, request.flatcar.kernel_release).primary
        _inspect_existing(docker, first)
        tags = precompiled_image_tags(request, kernel_of(docker, first))
        found.append(Built(tags, _inspect_existing(docker, tags.primary)))
    return found


def _inspect_existing(docker: Docker, reference: str) -> ImageInfo:
    if not docker.exists(reference):
        raise DockerError(f"{reference} is not in dockerd: run invoke build first")
    return docker.inspect(reference)


def push_images(built: list[Built], docker: Docker, progress: Progress) -> dict[str, str]:
    """Push every reference (the build image's first, so its layers go up once)."""
    digests = {}
    for image in built:
        if image.info is None:
            continue  # buildx pushed it already
        for reference in image.tags.references:
            docker.tag(image.info.id, reference)  # a stale local tag must not be pushed
            progress(f"Pushing {reference}\n")
            digests[reference] = docker.push(reference, progress)
    return digests


# --- report ------------------------------------------------------------------------------------


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":  # noqa: PLR2004 - decimal units, as docker prints
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _short(created_by: str, width: int = 70) -> str:
    # Classic-builder RUN steps read "|<n> ARG=value ... /bin/sh -c <command>".
    command = created_by.rpartition("/bin/sh -c ")[2] or created_by
    text = " ".join(command.removeprefix("#(nop) ").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def report(built: list[Built], say: Callable[[str], None] = print) -> None:
    """Tags, image size, and the size of every layer; for a precompiled image, what it adds."""
    base: ImageInfo | None = None
    for image in built:
        for reference in image.tags.references:
            say(reference)
        if image.info is None:
            say("  (multi-arch image, pushed by buildx: sizes are in the registry)")
            continue
        info = image.info
        say(f"  image {human_size(info.size)} in {len(info.layers)} layers")
        for step in info.data_steps:
            say(f"    {human_size(step.size):>9}  {_short(step.created_by)}")
        if base is not None:
            say("  " + sharing(base, info))
        base = info


def sharing(base: ImageInfo, image: ImageInfo) -> str:
    pairs = zip(base.layers, image.layers, strict=False)
    shared = len(list(takewhile(lambda pair: pair[0] == pair[1], pairs)))  # the layers in common
    added = len(image.layers) - shared
    extra = image.size - base.size
    return (
        f"shares {shared} of the build image's {len(base.layers)} layers and adds {added} "
        f"({human_size(extra)})"
    )
