"""``invoke publish``: build what the registry lacks or what changed, for every image of the matrix.

What a run does, for the user (steps, build inputs, reuse of packages, zstd, retries, dry runs),
is told in docs/images.md; here, what the code keeps to. An image (:class:`gdc.matrix.Image`)
has one platform per arch. Each arch is built natively on its own, pushed under a staging tag
(:meth:`~gdc.matrix.Image.staging_tag`), then the arches are merged into one index under every
tag of the image (``--step stage``, ``merge`` or ``all``, image by image).

Stage, per arch: the registry's image under the staging tag is read (manifest and config); it is
**built** and pushed, saying why, when there is none, when it is of another platform
(:data:`PLATFORMS`) or when its recorded build inputs (:mod:`gdc.inputs`) differ from what would
be built now (``--rebuild``: always), and **skipped** otherwise. A pushed image is read back
and checked the same way: a build that made another arch's image, or whose tag another job
overwrote, fails. With zstd, each arch image is then recompressed in the registry
(:mod:`gdc.compression`), as is an up-to-date one still gzip; one whose gzip layers are not what
its config says (:class:`~gdc.compression.DamagedImageError`) is built again, in that run.

Merge: each arch's staged image is checked as stage checks it (a merge-only run reads it from
the registry); an image with one arch wrong, missing or stale **fails**, naming it, and is never
merged nor called up to date. The index is made the same way every time, so its digest is known
before it is written, and a tag is up to date only when it is that index: every other tag gets
it (a manifest PUT, no blob moves): **tagged**.

Build images go first. A precompiled image starts from its build image's staging tag and fails,
saying so, only when that build *failed* (a failed tag does not block it). Everything else is
independent: a failure is recorded and the run goes on. Nothing is remembered between runs, so a
run cut short is completed by the next.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from gdc import inputs
from gdc.compression import (
    DEFAULT_LEVEL,
    Cache,
    Compression,
    DamagedImageError,
    has_gzip_layers,
    recompress,
)
from gdc.images import Base
from gdc.matrix import Exclusion, Image, Matrix
from gdc.registry import Registry, Repository, RetryBudget
from gdc.tags import Variant
from gdc.text import counts, first_line, format_table
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_INDEX,
    Manifest,
    digest_of,
)

# What a node of each arch runs, as an image config says it (the OCI image index spec's
# platform values: arm64 is variant v8; containerd takes an arm64 image without one for v8).
PLATFORMS = {"amd64": ("linux", "amd64", ("",)), "arm64": ("linux", "arm64", ("v8", ""))}
RETRY_BUDGET_SECONDS = 120.0  # one image's waits on 429 and 5xx, in all


class Step(StrEnum):
    STAGE = "stage"
    MERGE = "merge"
    ALL = "all"


class Status(StrEnum):
    BUILT = "built"
    TAGGED = "tagged"
    SKIPPED = "skipped"
    FAILED = "failed"
    EXCLUDED = "excluded"


class BuildError(RuntimeError):
    """A build or push that failed; the message is one line saying why."""


@dataclass(frozen=True)
class Descriptor:
    """One arch's image as an index lists it."""

    media_type: str
    digest: str
    size: int
    platform: dict[str, str]

    def json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                "platform": self.platform}  # fmt: skip


class Builder(Protocol):
    def base(self, image: Image, arch: str) -> Base:
        """What a build image of arch starts FROM (a precompiled one: its build image)."""
        ...

    def inputs(self, image: Image, arch: str, base: Base) -> dict[str, str]:
        """The build inputs a build of image for arch would record now."""
        ...

    def build(self, image: Image, arch: str, base: Base, previous: str = "") -> None:
        """Build image for arch on base and push it under its staging tag; BuildError if not.

        previous: the registry's image under that tag (``repository@sha256:...``), which a
        precompiled build reuses the packages of; "" if there is none.
        """
        ...


@dataclass(frozen=True)
class Outcome:
    image: Image
    status: Status
    detail: str
    planned: bool = False  # a dry run's step: nothing was done
    seconds: float = 0.0


def _platform(found: dict[str, str]) -> str:
    return "/".join(part for part in (found.get("os", "?"), found.get("architecture", "?"),
                                      found.get("variant", "")) if part)  # fmt: skip


def platform_problem(arch: str, found: dict[str, str]) -> str:
    """Why an image of platform found is not one for arch (a node of it could not run it)."""
    os, architecture, variants = PLATFORMS[arch]
    if (found.get("os"), found.get("architecture")) == (os, architecture) and found.get(
        "variant", ""
    ) in variants:
        return ""
    wanted = f"{os}/{architecture}{f'/{variants[0]}' if variants[0] else ''}"
    return f"it is a {_platform(found)} image, not {wanted}"


def _wrong(arch: str, staged: Descriptor) -> str:
    if staged.media_type in INDEX_TYPES:
        return "it is an image index, not one arch's image"
    return platform_problem(arch, staged.platform)


def index_for(descriptors: Iterable[Descriptor]) -> Manifest:
    """The index of the arches' images, byte for byte the same for the same images."""
    listed = list(descriptors)
    media_type = DOCKER_LIST if all(d.media_type == DOCKER_MANIFEST for d in listed) else OCI_INDEX
    body = json.dumps({"schemaVersion": 2, "mediaType": media_type,
                       "manifests": [d.json() for d in listed]},
                      sort_keys=True, separators=(",", ":")).encode()  # fmt: skip
    return Manifest(media_type, body, digest_of(body))


@dataclass
class Publisher:
    """One run: the registry, the builder, and what this run learnt about each staging tag."""

    matrix: Matrix
    registry: Registry
    repository: Repository
    builder: Builder
    dry_run: bool = False
    rebuild: bool = False
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic  # each image's time (progress line and summary)
    compression: Compression = Compression.ZSTD
    zstd_level: int = DEFAULT_LEVEL
    staged: dict[tuple[str, str], Descriptor] = field(default_factory=dict)  # (image id, arch)
    failed_builds: dict[tuple[str, str], str] = field(default_factory=dict)  # (driver, arch)
    planned: set[tuple[str, str]] = field(default_factory=set)  # a dry run's builds
    gzipped: set[tuple[str, str]] = field(default_factory=set)  # staged with gzip layers, read
    layers: Cache = field(default_factory=dict)  # gzip layer -> its zstd blob

    # --- the registry's view of one arch ------------------------------------------------------

    def _read(self, image: Image, arch: str) -> tuple[Descriptor, dict[str, Any]] | None:
        name, tag = self.repository.name, image.staging_tag(arch)
        if self.registry.digest(name, tag) is None:
            return None
        manifest = self.registry.manifest(name, tag)
        if has_gzip_layers(manifest):
            self.gzipped.add((image.id, arch))
        else:
            self.gzipped.discard((image.id, arch))
        size = len(manifest.body)
        if manifest.is_index:  # a staging tag names one arch's image: _wrong says so
            return Descriptor(manifest.media_type, manifest.digest, size, {}), {}
        config = self.registry.config(name, manifest)
        # As the config says, nothing assumed: a config without an architecture is no arch's.
        platform = {key: str(config[key]) for key in ("os", "architecture", "variant")
                    if config.get(key)}  # fmt: skip
        return Descriptor(manifest.media_type, manifest.digest, size, platform), config

    def _problems(self, image: Image, arch: str, found: tuple[Descriptor, dict[str, Any]],
                  base: Base, wanted: dict[str, str] | None = None) -> list[str]:  # fmt: skip
        """Why the staged image found is not what this run would merge for arch; [] if it is.
        wanted: the inputs a build would record now, if known."""
        wrong = _wrong(arch, found[0])
        if wrong:
            return [wrong]
        recorded = inputs.from_labels((found[1].get("config") or {}).get("Labels"))
        return inputs.changes(recorded, wanted or self.builder.inputs(image, arch, base))

    def _base(self, image: Image, arch: str) -> Base:
        if image.variant is Variant.BUILD:
            return self.builder.base(image, arch)
        build = self.matrix.build_image(image.driver)
        failed = self.failed_builds.get((image.driver.version, arch))
        if failed:
            raise BuildError(f"its build image failed on {arch} ({failed})")
        staged = self.staged.get((build.id, arch))
        reference = f"{self.repository}:{build.staging_tag(arch)}"
        if staged is None and (build.id, arch) in self.planned:
            return Base(reference, "")  # a dry run: the build image would be built first
        if staged is None:  # not published by this run (--variant precompiled): the registry's
            staged = self._staged(build, arch)
        return Base(reference, staged.digest)

    # --- stage --------------------------------------------------------------------------------

    def stage(self, image: Image, arch: str) -> tuple[Status, str]:
        """Build or skip one arch; (status, why)."""
        base = self._base(image, arch)
        # What a build would record now: a build that could not be made (a .run checksum not
        # recorded yet) fails here, in a dry run too.
        wanted = self.builder.inputs(image, arch, base)
        found = self._read(image, arch)
        wrong = _wrong(arch, found[0]) if found else ""
        if found is None:
            reasons = ["not in the registry"]
        elif wrong:
            reasons = [f"the staged image is not one for {arch} ({wrong})"]
        elif not base.digest and image.variant is Variant.BUILD:
            reasons = [(f"the base image {base.name} is not pinned by digest and a dry run "
                        "asks no dockerd, so whether it changed is unknown: pin it (--base-image "
                        "name@sha256:...) for an exact plan")]  # fmt: skip
        elif not base.digest:
            reasons = ["its build image would be built first"]
        elif self.rebuild:
            reasons = ["--rebuild"]
        else:
            reasons = self._problems(image, arch, found, base, wanted)
        if not reasons:
            try:
                self.staged[(image.id, arch)] = self._up_to_date(image, arch, found[0])  # type: ignore[index]
            except DamagedImageError as exc:  # only a build mends it
                wrong = f"its gzip layers could not be recompressed ({first_line(exc)})"
                reasons = [wrong]
            else:
                return Status.SKIPPED, f"{arch}: up to date"
        why = f"{arch}: {'; '.join(reasons)}"
        if self.dry_run:
            self.planned.add((image.id, arch))
            return Status.BUILT, why
        # A precompiled image reuses the packages of the one it replaces, where they fit
        # (images/precompiled/Dockerfile); --rebuild compiles everything again, and another
        # arch's image has nothing to give.
        reuse = image.variant is Variant.PRECOMPILED and not self.rebuild and not wrong
        previous = f"{self.repository}@{found[0].digest}" if reuse and found is not None else ""
        self.builder.build(image, arch, base, previous)
        self.staged[(image.id, arch)] = self._pushed(image, arch, base)
        return Status.BUILT, why

    def _pushed(self, image: Image, arch: str, base: Base) -> Descriptor:
        """The image a build just pushed, read back and checked, then (zstd) recompressed."""
        pushed = self._read(image, arch)
        if pushed is None:
            raise BuildError(f"built, but the registry has no {image.staging_tag(arch)}")
        problems = self._problems(image, arch, pushed, base)
        if problems:
            raise BuildError(f"built and pushed, but {image.staging_tag(arch)} in the registry "
                             f"is not what was built ({'; '.join(problems)}): not merged; "
                             "check the build's platform and that no other job pushes that "
                             "tag")  # fmt: skip
        return self._recompressed(image, arch) if self._zstd_wanted(image, arch) else pushed[0]

    def _up_to_date(self, image: Image, arch: str, found: Descriptor) -> Descriptor:
        """An up-to-date staged image; one still gzip (pushed before, or by a run cut short
        after its push) is recompressed, unless this is a dry run."""
        if self.dry_run or not self._zstd_wanted(image, arch):
            return found
        recompressed = self._recompressed(image, arch)
        self.say(f"  {arch}: up to date; its gzip layers recompressed to zstd")
        return recompressed

    def _zstd_wanted(self, image: Image, arch: str) -> bool:
        return self.compression is Compression.ZSTD and (image.id, arch) in self.gzipped

    def _recompressed(self, image: Image, arch: str) -> Descriptor:
        """The staged image of arch, its gzip layers recompressed to zstd in the registry."""
        tag = image.staging_tag(arch)
        digest = recompress(self.registry, self.repository.name, tag,
                            level=self.zstd_level, cache=self.layers)  # fmt: skip
        found = self._read(image, arch)
        if found is None or found[0].digest != digest:
            now = found[0].digest if found else "nothing"
            raise BuildError(f"recompressed {tag} to zstd as {digest}, but the registry now has "
                             f"{now} under it: not merged; check that no other job pushes that "
                             "tag")  # fmt: skip
        return found[0]

    # --- merge --------------------------------------------------------------------------------

    def _staged(self, image: Image, arch: str) -> Descriptor:
        """One arch's staged image, checked (a merge-only run reads it here); BuildError if bad."""
        staged = self.staged.get((image.id, arch))
        if staged is not None:
            return staged
        tag = image.staging_tag(arch)
        found = self._read(image, arch)
        if found is None:
            raise BuildError(f"no {arch} image under {tag} to merge: its stage failed or has "
                             "not run")  # fmt: skip
        problems = self._problems(image, arch, found, self._base(image, arch))
        if problems:
            raise BuildError(f"the {arch} image under {tag} is not what this run would merge "
                             f"({'; '.join(problems)}): not merged; stage it again")  # fmt: skip
        self.staged[(image.id, arch)] = found[0]
        return found[0]

    def merge(self, image: Image) -> tuple[Status, str]:
        descriptors = []
        for arch in image.arches:
            try:
                descriptors.append(self._staged(image, arch))
            except BuildError as exc:
                if image.variant is Variant.BUILD:
                    self.failed_builds[(image.driver.version, arch)] = first_line(exc)
                return Status.FAILED, first_line(exc)
        index = index_for(descriptors)
        name = self.repository.name
        stale = [tag for tag in image.tags.tags if self.registry.digest(name, tag) != index.digest]
        if not stale:
            return Status.SKIPPED, f"all {len(image.tags.tags)} tags up to date"
        if not self.dry_run:
            for tag in stale:
                self.registry.put_manifest(name, tag, index)
        return Status.TAGGED, f"{len(stale)} of {len(image.tags.tags)} tags set"

    # --- one image ----------------------------------------------------------------------------

    def publish_image(self, image: Image, arches: tuple[str, ...], step: Step) -> Outcome:
        started = self.clock()
        built, details, failed = False, [], False
        if step is not Step.MERGE:
            for arch in (a for a in image.arches if a in arches):
                try:
                    status, why = self.stage(image, arch)
                except (BuildError, DriverError) as exc:
                    failed = True
                    details.append(f"{arch}: {first_line(exc)}")
                    if image.variant is Variant.BUILD:
                        self.failed_builds[(image.driver.version, arch)] = first_line(exc)
                    continue
                built = built or status is Status.BUILT
                if status is Status.BUILT:
                    details.append(why)
        merged = Status.SKIPPED
        if step is not Step.STAGE and not failed and self.dry_run and built:
            details.append(f"then all {len(image.tags.tags)} tags set")
        elif step is not Step.STAGE and not failed:
            try:
                merged, why = self.merge(image)
            except (BuildError, DriverError) as exc:
                merged, why = Status.FAILED, first_line(exc)
            if merged is not Status.SKIPPED or not details:
                details.append(why)
        status = (Status.FAILED if failed or merged is Status.FAILED else Status.BUILT if built
                  else merged)  # fmt: skip
        seconds = self.clock() - started
        return Outcome(image, status, "; ".join(details) or "up to date", planned=self.dry_run,
                       seconds=seconds)  # fmt: skip


def publish(
    matrix: Matrix,
    registry: Registry,
    repository: Repository,
    builder: Builder,
    *,
    arches: tuple[str, ...] = (),
    step: Step = Step.ALL,
    variant: Variant | None = None,
    dry_run: bool = False,
    rebuild: bool = False,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    retry_budget: float = RETRY_BUDGET_SECONDS,
    compression: Compression = Compression.ZSTD,
    zstd_level: int = DEFAULT_LEVEL,
) -> list[Outcome]:
    """Plan and (unless dry_run) carry out every image of matrix; one outcome per image."""
    run = Publisher(matrix, registry, repository, builder, dry_run, rebuild, say, clock,
                    compression, zstd_level)  # fmt: skip
    # One budget for the run, what the up-front check waited included.
    registry.budget = RetryBudget(retry_budget, registry.budget.spent)
    chosen = [i for i in matrix.images if variant in (None, i.variant)]
    wanted = arches or matrix.arches
    outcomes = []
    for number, image in enumerate(chosen, start=1):
        counter = f"[{number}/{len(chosen)}]"
        say(f"{counter} {image.label}: {repository}:{image.tags.tags[0]}")
        outcome = run.publish_image(image, wanted, step)
        verb = _status(outcome)
        say(f"{counter} {verb} in {outcome.seconds:.1f} s: {outcome.detail}")
        outcomes.append(outcome)
    return outcomes


# --- the summary -------------------------------------------------------------------------------


def _status(outcome: Outcome) -> str:
    if not outcome.planned or outcome.status is Status.SKIPPED:
        return outcome.status.value
    return {Status.BUILT: "would build", Status.TAGGED: "would tag",
            Status.FAILED: "would fail"}.get(outcome.status, outcome.status.value)  # fmt: skip


def summary(
    outcomes: Iterable[Outcome],
    excluded: Iterable[Exclusion],
    repository: Repository | str,
    notes: Iterable[str] = (),
) -> str:
    """The table printed at the end: one row per image and per exclusion, then the counts.

    A failure with the same detail as one above says so instead of repeating it.
    """
    outcomes, excluded = list(outcomes), list(excluded)
    rows: list[tuple[str, ...]] = []
    first_with: dict[str, str] = {}
    for o in outcomes:
        detail = o.detail
        if o.status is Status.FAILED:
            if detail in first_with:
                detail = f"the same failure as {first_with[detail]}"
            else:
                first_with[detail] = o.image.tags.tags[0]
        seconds = f"{o.seconds:.0f} s" if o.seconds >= 1 else "-"
        rows.append((_status(o), o.image.label, ",".join(o.image.arches), o.image.tags.tags[0],
                     seconds, detail))  # fmt: skip
    rows += [(Status.EXCLUDED.value, f"{x.variant} {x.driver} for Flatcar {x.flatcar}", x.arch,
              "-", "-", x.reason) for x in excluded]  # fmt: skip
    table = format_table(("STATUS", "IMAGE", "ARCHES", "TAG", "TIME", "DETAIL"), rows)
    noted = "".join(f"note: {note}\n" for note in notes)
    return f"Summary for {repository}:\n{table}{noted}{counts(rows) or 'nothing to publish'}\n"


def failures(outcomes: Iterable[Outcome]) -> list[Outcome]:
    """The images that failed, or (in a dry run) would fail."""
    return [o for o in outcomes if o.status is Status.FAILED]
