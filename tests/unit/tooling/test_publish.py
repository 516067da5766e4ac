"""invoke publish against a loopback registry: what gets built, tagged, skipped or fails."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import tasks
from flatcar_feed import feed_entry, feed_from_tsv, lts_info_text, with_markers
from invoke.context import MockContext
from invoke.exceptions import Exit
from invoke.runners import Result
from oci_registry import IMAGE, INDEX, OCIRegistry, tar_layer

from gdc import cli_tasks, inputs, matrix, publish
from gdc.compression import Compression
from gdc.coverage import LtsInfo, parse_lts_info
from gdc.docker_api import BuildJob, DockerError, ImageInfo, Progress
from gdc.images import Base
from gdc.matrix import Image
from gdc.publish import BuildError, Status, Step
from gdc.registry import Registry, Repository
from gdc.tags import Variant
from gdc.versions import Versions, parse_versions
from nvidia_driver.formats.oci import ZSTD_LAYER

SUM = "ab" * 32
NAME = "gdc/driver"
BUILD = "610.57.04-flatcar"
KERNEL_IMAGE = "610.57.04-flatcar4593.2.5"  # the first tag of the 6.12.102 image
LTS_IMAGE = "610.57.04-flatcar4081.3.10"
PINNED = "debian@sha256:" + "1" * 64


# The archives every image needs, recorded (versions.toml's [drivers."<version>".redist]).
REDIST = {
    component: {"version": "610.57.04", "amd64": "12" * 32, "arm64": "34" * 32}
    for component in ("fabricmanager", "libnvidia_nscq")
}


def _versions(arches: tuple[str, ...] = ("amd64", "arm64"), sums: bool = True,
              channels: tuple[str, ...] = ("stable", "lts")) -> Versions:  # fmt: skip
    checksums = dict.fromkeys(arches, SUM if sums else "TODO")
    return parse_versions({
        "images": {"channels": list(channels), "arches": list(arches)},
        "drivers": {"610.57.04": {"sha256": checksums, "redist": REDIST}},
    })  # fmt: skip


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as server:
        yield server


@dataclass
class FakeBuilder:
    """Pushes a made-up image per arch under the staging tag, recording its inputs."""

    registry: OCIRegistry
    entrypoint: str = "v1"
    built: list[str] = field(default_factory=list)  # "<first tag> <arch>"
    failing: set[str] = field(default_factory=set)  # first tags whose build fails
    previous: dict[str, str] = field(default_factory=dict)  # "<first tag> <arch>" -> seed
    amd64_only: set[str] = field(default_factory=set)  # first tags built for amd64 on any arch

    def base(self, image: Image, arch: str) -> Base:  # noqa: ARG002 - one base for all
        return Base("debian@sha256:" + "1" * 64, "sha256:" + "1" * 64)

    def inputs(self, image: Image, arch: str, base: Base) -> dict[str, str]:
        found = {"base": base.digest, "entrypoint": self.entrypoint}
        if image.variant is Variant.PRECOMPILED:
            releases = image.platform(arch).releases
            found[inputs.RELEASES] = " ".join(c.version for c in releases)
        return found

    def build(self, image: Image, arch: str, base: Base, previous: str = "") -> None:
        first = image.tags.tags[0]
        self.built.append(f"{first} {arch}")
        self.previous[f"{first} {arch}"] = previous
        if first in self.failing:
            raise BuildError("docker build failed: returned a non-zero code: 2")
        if image.variant is Variant.PRECOMPILED:
            version = image.driver.version
            assert base.name == f"{self.registry.host}/{NAME}:{version}-flatcar-{arch}"
        labels = {inputs.INPUTS_LABEL: inputs.to_label(self.inputs(image, arch, base))}
        # Every build is a new image, as a real one is (its config has the build's date).
        label = f"{first} build {len(self.built)}"
        made = "amd64" if first in self.amd64_only else arch  # a runner of the wrong arch
        self.registry.add_image(NAME, [image.staging_tag(arch)], (made,), index=False,
                                labels=labels, label=label)  # fmt: skip


def _matrix(registry: OCIRegistry, feed: dict[str, Any] | None = None,
            versions: Versions | None = None) -> matrix.Matrix:  # fmt: skip
    feed_text = json.dumps(feed or feed_from_tsv())
    lts = LtsInfo(parse_lts_info(lts_info_text()))
    return matrix.build_matrix(feed_text, versions or _versions(), lts_info=lts,
                               registry=f"{registry.host}/gdc")  # fmt: skip


def _publish(registry: OCIRegistry, builder: FakeBuilder, covered: matrix.Matrix,
             **options: Any) -> tuple[list[publish.Outcome], list[str]]:  # fmt: skip
    said: list[str] = []
    repository = Repository(registry.host, NAME)
    client = Registry(registry.host, sleep=lambda _seconds: None)
    outcomes = publish.publish(covered, client, repository, builder, say=said.append, **options)
    return outcomes, said


def _published(registry: OCIRegistry) -> FakeBuilder:
    """The builder of a first run, from an empty registry: every image built and published."""
    builder = FakeBuilder(registry)
    _publish(registry, builder, _matrix(registry))
    return builder


def _statuses(outcomes: list[publish.Outcome]) -> list[tuple[str, str]]:
    return [(o.image.tags.tags[0], o.status.value) for o in outcomes]


def test_one_build_image_per_driver_and_one_precompiled_image_per_kernel(
    registry: OCIRegistry,
) -> None:
    covered = _matrix(registry, versions=_versions(channels=("stable", "beta", "alpha", "lts")))
    found = [(i.variant.value, i.kernel, [c.version for c in i.releases]) for i in covered.images]
    assert found == [
        ("build", "", []),
        ("precompiled", "6.6.150-flatcar", ["4081.3.10"]),
        ("precompiled", "6.12.102-flatcar", ["4593.2.5", "4757.1.0", "4790.0.0"]),
    ]
    kernel_image = covered.images[2]
    assert kernel_image.tags.tags == (
        "610.57.04-flatcar4593.2.5", "610.57.04-flatcar4757.1.0", "610.57.04-flatcar4790.0.0",
        # The cross-release aliases: whatever the first GPU node runs (a covered release, or
        # the one a stream's current release superseded), a node on 6.12.102 finds this image.
        "610-6.12.102-flatcar-flatcar4081.3.9", "610-6.12.102-flatcar-flatcar4081.3.10",
        "610-6.12.102-flatcar-flatcar4593.2.4", "610-6.12.102-flatcar-flatcar4593.2.5",
        "610-6.12.102-flatcar-flatcar4722.1.0", "610-6.12.102-flatcar-flatcar4757.0.0",
        "610-6.12.102-flatcar-flatcar4757.1.0", "610-6.12.102-flatcar-flatcar4790.0.0",
    )  # fmt: skip
    assert kernel_image.staging_tag("arm64") == "610.57.04-6.12.102-flatcar-arm64"
    # LTS 4081's arm64 tree has x86-64 host tools: no arm64 platform for it.
    assert covered.images[1].arches == ("amd64",)


def test_from_empty_everything_is_built_and_a_second_run_builds_nothing(
    registry: OCIRegistry,
) -> None:
    builder = FakeBuilder(registry)
    outcomes, said = _publish(registry, builder, _matrix(registry))
    assert _statuses(outcomes) == [(BUILD, "built"), (LTS_IMAGE, "built"),
                                   (KERNEL_IMAGE, "built")]  # fmt: skip
    assert builder.built == [f"{BUILD} amd64", f"{BUILD} arm64", f"{LTS_IMAGE} amd64",
                             f"{KERNEL_IMAGE} amd64", f"{KERNEL_IMAGE} arm64"]  # fmt: skip
    assert said[0] == f"[1/3] build 610.57.04: {registry.host}/{NAME}:{BUILD}"
    assert said[1].startswith("[1/3] built in ")
    tags = registry.tags(NAME)
    client = Registry(registry.host)
    assert client.platforms(NAME, KERNEL_IMAGE) == {"linux/amd64", "linux/arm64"}
    for tag in (BUILD, f"{BUILD}-flatcar4081.3.10", "610-6.12.102-flatcar-flatcar4081.3.10"):
        assert tag in tags
    assert tags["610-6.12.102-flatcar-flatcar4081.3.10"] == tags[KERNEL_IMAGE]
    assert tags["610-6.6.150-flatcar-flatcar4593.2.5"] == tags[LTS_IMAGE]
    builder.built.clear()
    registry.log.clear()
    again, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    assert {o.status for o in again} == {Status.SKIPPED}
    # A no-op run: per arch image a HEAD, the manifest and its config; a HEAD per tag.
    assert [m for m, _, _ in registry.log if m == "PUT"] == []
    assert len(registry.log) == 5 * 3 + sum(len(i.tags.tags) for i in _matrix(registry).images)


@dataclass
class GzipBuilder(FakeBuilder):
    """Pushes real gzip layers, as dockerd does: a base layer every image shares, and one of
    its own per build."""

    def build(self, image: Image, arch: str, base: Base, previous: str = "") -> None:
        super().build(image, arch, base, previous)  # records it, checks the base
        labels = {inputs.INPUTS_LABEL: inputs.to_label(self.inputs(image, arch, base))}
        own = tar_layer({"build": f"{image.tags.tags[0]} {len(self.built)}".encode()})
        self.registry.add_layered_image(NAME, [image.staging_tag(arch)],
                                        [tar_layer({"etc/os-release": b"ID=debian\n"}), own],
                                        arch=arch, labels=labels)  # fmt: skip


def _layer_types(registry: OCIRegistry, reference: str) -> list[str]:
    stored = registry.manifests[NAME][reference]
    return [layer["mediaType"] for layer in json.loads(stored.body)["layers"]]


def test_each_staged_image_is_recompressed_to_zstd_and_merged_by_its_zstd_digest(
    registry: OCIRegistry,
) -> None:
    builder = GzipBuilder(registry)
    versions = _versions(channels=("stable",))
    outcomes, _ = _publish(registry, builder, _matrix(registry, versions=versions))
    assert {o.status for o in outcomes} == {Status.BUILT}
    staging = f"{BUILD}-amd64"
    assert _layer_types(registry, staging) == [ZSTD_LAYER] * 2
    merged = json.loads(registry.manifests[NAME][BUILD].body)
    assert merged["mediaType"] == INDEX
    assert {e["digest"] for e in merged["manifests"]} == {
        registry.tags(NAME)[f"{BUILD}-amd64"], registry.tags(NAME)[f"{BUILD}-arm64"]}  # fmt: skip
    # The precompiled image's base layer is the build image's zstd blob, compressed once.
    precompiled = json.loads(registry.manifests[NAME]["610.57.04-6.12.102-flatcar-amd64"].body)
    build = json.loads(registry.manifests[NAME][staging].body)
    assert precompiled["layers"][0] == build["layers"][0]
    # The config is the same under zstd: the next run compares it and builds nothing.
    builder.built.clear()
    registry.log.clear()
    again, _ = _publish(registry, builder, _matrix(registry, versions=versions))
    assert builder.built == []
    assert {o.status for o in again} == {Status.SKIPPED}
    assert [m for m, _, _ in registry.log if m in {"PUT", "POST"}] == []


def test_an_up_to_date_gzip_image_is_recompressed_and_gzip_is_kept_when_asked(
    registry: OCIRegistry,
) -> None:
    builder = GzipBuilder(registry)
    versions = _versions(arches=("amd64",), channels=("stable",))
    _publish(registry, builder, _matrix(registry, versions=versions), compression=Compression.GZIP)
    staging = f"{BUILD}-amd64"
    assert _layer_types(registry, staging)[0].endswith("tar.gzip")
    builder.built.clear()
    again, said = _publish(registry, builder, _matrix(registry, versions=versions))
    # The build image is not rebuilt, only recompressed; its digest is new, and so the base
    # of the precompiled image: that is rebuilt, once (reusing its packages, as any rebuild).
    assert builder.built == [f"{KERNEL_IMAGE} amd64"]
    assert [o.status for o in again] == [Status.TAGGED, Status.BUILT]
    assert "  amd64: up to date; its gzip layers recompressed to zstd" in said
    assert _layer_types(registry, staging) == [ZSTD_LAYER] * 2
    index = json.loads(registry.manifests[NAME][BUILD].body)
    assert index["manifests"][0]["digest"] == registry.tags(NAME)[staging]


def test_a_changed_input_rebuilds_exactly_the_images_it_reaches(registry: OCIRegistry) -> None:
    builder = _published(registry)
    before = registry.tags(NAME)
    builder.built.clear()
    builder.entrypoint = "v2"
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert len(builder.built) == 5
    assert outcomes[0].detail.startswith("amd64: the entrypoint changed; arm64: the entrypoint")
    after = registry.tags(NAME)
    assert after[BUILD] != before[BUILD]
    builder.built.clear()
    _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    # The base of a precompiled image is its build image: a rebuilt build image rebuilds it.
    builder.built.clear()
    registry.manifests[NAME].pop(f"{BUILD[:-8]}-flatcar-arm64")
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{BUILD} arm64", f"{KERNEL_IMAGE} arm64"]
    assert "arm64: the base image changed" in outcomes[2].detail
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry), rebuild=True)
    assert len(builder.built) == 5
    assert outcomes[0].detail.startswith("amd64: --rebuild")


def test_a_rebuilt_precompiled_image_reuses_the_packages_of_the_one_it_replaces(
    registry: OCIRegistry,
) -> None:
    builder = _published(registry)
    assert set(builder.previous.values()) == {""}  # nothing to replace yet
    replaced = registry.tags(NAME)["610.57.04-6.12.102-flatcar-amd64"]  # its staging tag
    builder.entrypoint = "v2"
    builder.previous.clear()
    _publish(registry, builder, _matrix(registry))
    # By digest: the image the staging tag named when the run read it, not whatever it names
    # when the build pulls it.
    assert builder.previous[f"{KERNEL_IMAGE} amd64"] == f"{registry.host}/{NAME}@{replaced}"
    assert builder.previous[f"{BUILD} amd64"] == ""  # a build image has no packages
    builder.previous.clear()
    _publish(registry, builder, _matrix(registry), rebuild=True)
    assert set(builder.previous.values()) == {""}  # --rebuild compiles everything again


def test_a_new_release_of_a_live_kernel_rebuilds_its_image_and_tags_the_rest(
    registry: OCIRegistry,
) -> None:
    builder = _published(registry)
    build_digest = registry.tags(NAME)[BUILD]
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", "6.12.110")
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry, with_markers(feed)))
    assert builder.built == ["610.57.04-flatcar4593.2.6 amd64", "610.57.04-flatcar4593.2.6 arm64"]
    assert _statuses(outcomes) == [(BUILD, "tagged"), (LTS_IMAGE, "tagged"),
                                   ("610.57.04-flatcar4593.2.6", "built")]  # fmt: skip
    assert outcomes[0].detail == "1 of 3 tags set"
    assert registry.tags(NAME)[f"{BUILD}-flatcar4593.2.6"] == build_digest  # no rebuild
    assert registry.tags(NAME)["610-6.6.150-flatcar-flatcar4593.2.6"] == registry.tags(NAME)[
        LTS_IMAGE]  # fmt: skip


def test_a_newly_recorded_driver_is_built_by_the_next_run_as_a_new_release_is(
    registry: OCIRegistry,
) -> None:
    """A merged proposal of invoke propose-drivers replaces the branch's driver in versions.toml:
    the next run builds the new driver's images; the old driver's stay as they were."""
    builder = _published(registry)
    before = registry.tags(NAME)
    newer = "610.60.01"
    redist = {name: {**fields, "version": newer} for name, fields in REDIST.items()}
    versions = parse_versions({
        "images": {"channels": ["stable", "lts"], "arches": ["amd64", "arm64"]},
        "drivers": {newer: {"sha256": dict.fromkeys(("amd64", "arm64"), SUM), "redist": redist}},
    })  # fmt: skip
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry, versions=versions))
    assert _statuses(outcomes) == [(f"{newer}-flatcar", "built"),
                                   (f"{newer}-flatcar4081.3.10", "built"),
                                   (f"{newer}-flatcar4593.2.5", "built")]  # fmt: skip
    assert len(builder.built) == 5
    after = registry.tags(NAME)
    old = {tag: digest for tag, digest in before.items() if tag.startswith("610.57.04-")}
    assert {tag: after[tag] for tag in old} == old, "the old driver's own tags are untouched"
    # The branch's usePrecompiled tags move to its new point release.
    assert after["610-6.12.102-flatcar-flatcar4593.2.5"] == after[f"{newer}-flatcar4593.2.5"]


def test_a_failure_is_recorded_and_the_run_goes_on(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry, failing={LTS_IMAGE})
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert _statuses(outcomes) == [(BUILD, "built"), (LTS_IMAGE, "failed"),
                                   (KERNEL_IMAGE, "built")]  # fmt: skip
    assert outcomes[1].detail == "amd64: docker build failed: returned a non-zero code: 2"
    assert publish.failures(outcomes) == [outcomes[1]]
    builder.failing.clear()
    builder.built.clear()
    rerun, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{LTS_IMAGE} amd64"]
    assert publish.failures(rerun) == []


def test_only_a_failed_build_image_build_blocks_its_precompiled_images(
    registry: OCIRegistry,
) -> None:
    builder = FakeBuilder(registry, failing={BUILD})
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{BUILD} amd64", f"{BUILD} arm64"]
    assert [o.status for o in outcomes] == [Status.FAILED] * 3
    assert outcomes[2].detail.startswith("amd64: its build image failed on amd64 (docker build")


def test_precompiled_images_alone_start_from_the_build_image_in_the_registry(
    registry: OCIRegistry,
) -> None:
    """--variant precompiled (its help: only precompiled images): the build images are not
    published by this run, so their staged images are read from the registry, not called
    missing."""
    builder = _published(registry)
    builder.built.clear()
    builder.entrypoint = "v2"  # every image is stale: the build image, not this run's, too
    outcomes, _ = _publish(registry, builder, _matrix(registry), variant=Variant.PRECOMPILED)
    stale = [f"{arch}: the {arch} image under 610.57.04-flatcar-{arch} is not what this run "
             "would merge (the entrypoint changed): not merged; stage it again"
             for arch in ("amd64", "arm64")]  # fmt: skip
    assert [o.detail for o in outcomes] == [stale[0], "; ".join(stale)]
    builder.entrypoint = "v1"
    outcomes, _ = _publish(registry, builder, _matrix(registry), variant=Variant.PRECOMPILED)
    assert {o.status for o in outcomes} == {Status.SKIPPED}
    assert builder.built == []


def test_stage_and_merge_in_separate_runs_as_the_arch_jobs_do(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry)
    covered = _matrix(registry)
    for arch in ("amd64", "arm64"):
        staged, _ = _publish(registry, builder, covered, arches=(arch,), step=Step.STAGE)
        assert {o.status for o in staged if arch in o.image.arches} == {Status.BUILT}
    assert BUILD not in registry.tags(NAME)
    merged, _ = _publish(registry, builder, covered, step=Step.MERGE)
    assert {o.status for o in merged} == {Status.TAGGED}
    assert Registry(registry.host).platforms(NAME, BUILD) == {"linux/amd64", "linux/arm64"}


def test_a_merge_without_an_arch_fails_saying_which(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry)
    covered = _matrix(registry)
    _publish(registry, builder, covered, arches=("amd64",), step=Step.STAGE)
    merged, _ = _publish(registry, builder, covered, step=Step.MERGE)
    assert merged[0].status is Status.FAILED
    assert merged[0].detail.startswith("no arm64 image under 610.57.04-flatcar-arm64 to merge")


def test_a_driver_without_a_checksum_fails_before_building(registry: OCIRegistry) -> None:
    class NoSums(FakeBuilder):
        def inputs(self, image: Image, arch: str, base: Base) -> dict[str, str]:  # noqa: ARG002
            raise BuildError("no SHA-256 recorded for NVIDIA-Linux-*-610.57.04.run on amd64")

    builder = NoSums(registry)
    _publish(registry, FakeBuilder(registry), _matrix(registry))
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    assert outcomes[0].status is Status.FAILED
    assert "no SHA-256 recorded" in outcomes[0].detail
    assert "--driver-sha256" not in outcomes[0].detail


def test_429_and_5xx_are_retried_honouring_retry_after(registry: OCIRegistry) -> None:
    builder = _published(registry)
    waits: list[float] = []
    client = Registry(registry.host, sleep=waits.append)
    registry.burst = [(429, "3"), (503, ""), (429, "Wed, 21 Oct 2015 07:28:00 GMT")]
    outcomes = publish.publish(_matrix(registry), client, Repository(registry.host, NAME),
                               builder, say=lambda _line: None)  # fmt: skip
    assert {o.status for o in outcomes} == {Status.SKIPPED}
    assert waits == [3.0, 2.0, 0.0]  # Retry-After, then backoff; a past date: at once
    assert client.retried == 3
    registry.burst = [(429, "3600")]  # longer than we wait: the answer stands
    outcomes = publish.publish(_matrix(registry), client, Repository(registry.host, NAME),
                               builder, say=lambda _line: None)  # fmt: skip
    assert outcomes[0].status is Status.FAILED
    assert "429" in outcomes[0].detail


def test_a_registry_error_fails_each_image_with_its_reason(registry: OCIRegistry) -> None:
    registry.status = 500
    builder = FakeBuilder(registry)
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    assert {o.status for o in outcomes} == {Status.FAILED}
    assert "answered GET gdc/driver:610.57.04-flatcar-amd64 with 500" in outcomes[0].detail


def test_identical_failures_are_told_once(registry: OCIRegistry) -> None:
    class NoBase(FakeBuilder):
        def base(self, image: Image, arch: str) -> Base:  # noqa: ARG002
            raise BuildError("the base image debian:x is neither pinned by digest nor in dockerd")

    versions = parse_versions({"images": {"channels": ["stable"], "arches": ["amd64"]},
                               "drivers": {"580.178.04": {"sha256": {"amd64": SUM}},
                                           "610.57.04": {"sha256": {"amd64": SUM}}}})  # fmt: skip
    outcomes, _ = _publish(registry, NoBase(registry), _matrix(registry, versions=versions))
    assert [o.status for o in outcomes] == [Status.FAILED] * 4
    lines = publish.summary(outcomes, (), "r").splitlines()
    assert sum("neither pinned" in line for line in lines) == 2  # once per kind of image
    assert lines[3].endswith("the same failure as 580.178.04-flatcar")


def test_a_dry_run_prints_the_plan_changes_nothing_and_counts_failures(
    registry: OCIRegistry,
) -> None:
    covered = _matrix(registry)
    builder = FakeBuilder(registry)
    ticks = itertools.count(0.0)  # each reading of the clock is one second later
    outcomes, said = _publish(registry, builder, covered, dry_run=True, clock=ticks.__next__)
    assert builder.built == []
    assert [method for method, _, _ in registry.log if method == "PUT"] == []
    assert said[1] == (
        "[1/3] would build in 1.0 s: amd64: not in the registry; arm64: not in the registry; "
        "then all 3 tags set"
    )
    assert publish.failures(outcomes) == []
    table = publish.summary(outcomes, covered.excluded, "r").splitlines()
    assert table[-1].startswith("would build 3")
    registry.status = 500
    failing, _ = _publish(registry, builder, covered, dry_run=True)
    assert len(publish.failures(failing)) == 3


def test_the_summary_lists_outcomes_exclusions_notes_and_counts(registry: OCIRegistry) -> None:
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", None)
    covered = _matrix(registry, with_markers(feed))
    builder = FakeBuilder(registry, failing={LTS_IMAGE})
    outcomes, _ = _publish(registry, builder, covered)
    lines = publish.summary(outcomes, covered.excluded, "r/driver", ["a note"]).splitlines()
    assert lines[0] == "Summary for r/driver:"
    assert lines[1].split() == ["STATUS", "IMAGE", "ARCHES", "TAG", "TIME", "DETAIL"]
    assert lines[2].split()[:3] == ["built", "build", "610.57.04"]
    assert lines[3].split()[:2] == ["failed", "precompiled"]
    assert any(line.startswith("excluded  * * for Flatcar 4593.2.6") for line in lines)
    assert "note: a note" in lines
    assert lines[-1].startswith("built 1, failed 1, excluded")


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_registry_that_answers_one_image_badly_fails_that_image_only(
    registry: OCIRegistry, dry_run: bool
) -> None:
    covered = _matrix(registry)
    lts = next(i for i in covered.images if i.tags.tags[0] == LTS_IMAGE)
    maintenance = (200, b"<html>Down for maintenance</html>", {})  # no Content-Type
    registry.spoiled[f"/v2/{NAME}/manifests/{lts.staging_tag('amd64')}"] = maintenance
    builder = FakeBuilder(registry)
    outcomes, said = _publish(registry, builder, covered, dry_run=dry_run)
    failed = "would fail" if dry_run else "failed"
    done = "would build" if dry_run else "built"
    assert [(o.image.tags.tags[0], publish.failures([o]) != []) for o in outcomes] == [
        (BUILD, False), (LTS_IMAGE, True), (KERNEL_IMAGE, False)]  # fmt: skip
    assert said[3].startswith(f"[2/3] {failed} in ")
    assert "amd64: the registry" in said[3]
    assert "the manifest: not JSON" in said[3]
    lines = publish.summary(outcomes, covered.excluded, "r").splitlines()
    assert next(line for line in lines if LTS_IMAGE in line).startswith(failed)
    assert lines[-1].startswith(f"{done} 2, {failed} 1")


def test_an_arm64_tag_whose_header_names_the_amd64_image_is_not_merged(
    registry: OCIRegistry,
) -> None:
    builder = _published(registry)
    tags = registry.tags(NAME)
    arm64 = registry.manifests[NAME][f"{BUILD}-arm64"]
    headers = {"Content-Type": arm64.media_type, "Docker-Content-Digest": tags[f"{BUILD}-amd64"]}
    registry.spoiled[f"/v2/{NAME}/manifests/{BUILD}-arm64"] = (200, arm64.body, headers)
    registry.manifests[NAME].pop(BUILD)  # the index must be written again
    outcomes, _ = _publish(registry, builder, _matrix(registry), step=Step.MERGE)
    assert outcomes[0].status is Status.FAILED
    assert f"Docker-Content-Digest {tags[f'{BUILD}-amd64']}" in outcomes[0].detail
    assert BUILD not in registry.tags(NAME)


def test_an_up_to_date_gzip_image_whose_layers_cannot_be_recompressed_is_rebuilt(
    registry: OCIRegistry,
) -> None:
    builder = GzipBuilder(registry)
    versions = _versions(arches=("amd64",), channels=("stable",))
    covered = _matrix(registry, versions=versions)
    _publish(registry, builder, covered, compression=Compression.GZIP)
    # The staged build image as a damaged push leaves it: its layers are not its config's.
    staging = f"{BUILD}-amd64"
    config = registry.blobs[json.loads(registry.manifests[NAME][staging].body)["config"]["digest"]]
    labels = json.loads(config)["config"]["Labels"]
    registry.add_layered_image(NAME, [staging], [tar_layer({"a": b"1"})], labels=labels,
                               diff_ids=["sha256:" + "9" * 64])  # fmt: skip
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, covered)
    assert builder.built == [f"{BUILD} amd64", f"{KERNEL_IMAGE} amd64"]
    assert builder.previous[f"{BUILD} amd64"] == ""
    assert outcomes[0].status is Status.BUILT
    assert "its gzip layers could not be recompressed" in outcomes[0].detail
    assert _layer_types(registry, staging) == [ZSTD_LAYER] * 2


def test_one_retry_budget_for_the_whole_run_and_what_it_spent_stated(registry: OCIRegistry) -> None:
    builder = _published(registry)
    waits: list[float] = []
    client = Registry(registry.host, sleep=waits.append)
    registry.burst = [(429, "50"), (429, "50")]  # the first image waits 100 s of 120

    def say(line: str) -> None:
        if line.startswith("[2/3] precompiled"):  # the second image is asked to wait 50 s more
            registry.burst = [(429, "50")]

    outcomes = publish.publish(_matrix(registry), client, Repository(registry.host, NAME),
                               builder, say=say)  # fmt: skip
    assert waits == [50.0, 50.0]
    assert [o.status for o in outcomes].count(Status.FAILED) == 1
    assert "after 100 s of retries" in publish.failures(outcomes)[0].detail
    assert client.budget.stated() == "100 of the run's 120 s retry budget waited"


# --- what is merged is what a node of each arch runs -------------------------------------------


def _restage(registry: OCIRegistry, tag: str, made: str, variant: str = "") -> None:
    """Put a made-arch image under tag, with the labels (build inputs) of the one there."""
    stored = registry.manifests[NAME][tag]
    config = json.loads(registry.blobs[json.loads(stored.body)["config"]["digest"]])
    registry.add_image(NAME, [tag], (made,), index=False, labels=config["config"]["Labels"],
                       variant=variant)  # fmt: skip


KERNEL_ARM64 = "610.57.04-6.12.102-flatcar-arm64"  # the 6.12.102 image's arm64 staging tag


def test_another_arch_s_image_under_a_staging_tag_is_rebuilt_not_up_to_date(
    registry: OCIRegistry,
) -> None:
    builder = _published(registry)
    before = registry.tags(NAME)[KERNEL_IMAGE]
    _restage(registry, KERNEL_ARM64, "amd64")  # the same build inputs, the wrong arch
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{KERNEL_IMAGE} arm64"]
    assert builder.previous[f"{KERNEL_IMAGE} arm64"] == ""  # an amd64 image has no packages
    assert outcomes[2].detail.startswith("arm64: the staged image is not one for arm64 (it is a "
                                         "linux/amd64 image, not linux/arm64/v8)")  # fmt: skip
    assert Registry(registry.host).platforms(NAME, KERNEL_IMAGE) == {"linux/amd64",
                                                                     "linux/arm64"}  # fmt: skip
    assert registry.tags(NAME)[KERNEL_IMAGE] != before
    # An index under a staging tag (a multi-arch push to the wrong tag): rebuilt too.
    registry.add_image(NAME, [KERNEL_ARM64], ("amd64", "arm64"))
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{KERNEL_IMAGE} arm64"]
    assert "(it is an image index, not one arch's image)" in outcomes[2].detail


def test_a_build_that_pushes_another_arch_fails_that_image_only(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry, amd64_only={KERNEL_IMAGE})
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert _statuses(outcomes) == [(BUILD, "built"), (LTS_IMAGE, "built"),
                                   (KERNEL_IMAGE, "failed")]  # fmt: skip
    assert outcomes[2].detail == (
        f"amd64: not in the registry; arm64: built and pushed, but {KERNEL_ARM64} in the "
        "registry is not what was built (it is a linux/amd64 image, not linux/arm64/v8): not "
        "merged; check the build's platform and that no other job pushes that tag"
    )
    assert KERNEL_IMAGE not in registry.tags(NAME)  # never merged
    # Never "up to date" either: the next run builds it again, and fails again.
    builder.built.clear()
    again, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [f"{KERNEL_IMAGE} arm64"]
    assert _statuses(again)[2] == (KERNEL_IMAGE, "failed")
    builder.amd64_only.clear()
    fixed, _ = _publish(registry, builder, _matrix(registry))
    assert _statuses(fixed)[2] == (KERNEL_IMAGE, "built")


def test_a_merge_only_run_refuses_a_wrong_arch_or_stale_staged_image(
    registry: OCIRegistry,
) -> None:
    builder = FakeBuilder(registry)
    covered = _matrix(registry)
    _publish(registry, builder, covered, step=Step.STAGE)
    _restage(registry, KERNEL_ARM64, "arm64", variant="v7")  # 32-bit arm on an arm64 tag
    merged, _ = _publish(registry, builder, covered, step=Step.MERGE)
    assert _statuses(merged) == [(BUILD, "tagged"), (LTS_IMAGE, "tagged"),
                                 (KERNEL_IMAGE, "failed")]  # fmt: skip
    assert merged[2].detail == (
        f"the arm64 image under {KERNEL_ARM64} is not what this run would merge (it is a "
        "linux/arm64/v7 image, not linux/arm64/v8): not merged; stage it again"
    )
    assert KERNEL_IMAGE not in registry.tags(NAME)
    _restage(registry, KERNEL_ARM64, "arm64", variant="v8")  # as dockerd writes it: fine
    merged, _ = _publish(registry, builder, covered, step=Step.MERGE)
    assert _statuses(merged)[2] == (KERNEL_IMAGE, "tagged")
    # Staged by an older commit (another entrypoint): refused, and so are the precompiled
    # images on that build image.
    builder.entrypoint = "v2"
    stale, _ = _publish(registry, builder, covered, step=Step.MERGE)
    assert [o.status for o in stale] == [Status.FAILED] * 3
    assert stale[0].detail == (
        "the amd64 image under 610.57.04-flatcar-amd64 is not what this run would merge (the "
        "entrypoint changed): not merged; stage it again"
    )
    assert stale[1].detail.startswith("its build image failed on amd64 (the amd64 image under")


def test_a_tag_whose_index_lists_other_platforms_is_not_up_to_date(registry: OCIRegistry) -> None:
    builder = _published(registry)
    good = registry.tags(NAME)[BUILD]
    amd64 = registry.tags(NAME)["610.57.04-flatcar-amd64"]
    listed = [{"mediaType": IMAGE, "digest": amd64, "size": 1,
               "platform": {"os": "linux", "architecture": arch}}
              for arch in ("amd64", "arm64")]  # fmt: skip
    twice = {"schemaVersion": 2, "mediaType": INDEX, "manifests": listed}
    registry.put(NAME, [BUILD], INDEX, json.dumps(twice).encode())  # amd64 listed as arm64
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert (outcomes[0].status, outcomes[0].detail) == (Status.TAGGED, "1 of 3 tags set")
    assert registry.tags(NAME)[BUILD] == good


# --- retry budgets -----------------------------------------------------------------------------


class ThrottledPuts(OCIRegistry):
    """Answers every manifest PUT with 429 and Retry-After: 60 while throttling."""

    throttling = False

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.command != "PUT" or not self.throttling:
            super().answer(handler)
            return
        handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        handler.send_response(429)
        for key, value in (("Retry-After", "60"), ("Content-Length", "0")):
            handler.send_header(key, value)
        handler.end_headers()


def test_a_rate_limited_image_fails_within_its_retry_budget_saying_so() -> None:
    with ThrottledPuts() as registry:
        builder = FakeBuilder(registry)
        _publish(registry, builder, _matrix(registry), step=Step.STAGE)
        registry.throttling = True
        waits: list[float] = []
        client = Registry(registry.host, sleep=waits.append)
        outcomes = publish.publish(_matrix(registry), client, Repository(registry.host, NAME),
                                   builder, step=Step.MERGE, say=lambda _line: None)  # fmt: skip
        assert waits == [60.0, 60.0]  # 120 s for the run, not 4 retries of 60 s per request
        assert {o.status for o in outcomes} == {Status.FAILED}
        assert outcomes[0].detail == (
            f"the registry {registry.host} answered PUT {NAME}:{BUILD} with 429 Too Many "
            "Requests after 120 s of retries: rate-limited by the registry (HTTP 429), retry later"
        )
        waits.clear()
        short = publish.publish(_matrix(registry), client, Repository(registry.host, NAME),
                                builder, step=Step.MERGE, say=lambda _line: None,
                                retry_budget=0)  # fmt: skip
        assert waits == []
        assert "rate-limited by the registry (HTTP 429), retry later" in short[0].detail


# --- through invoke, with a fake dockerd that pushes into the loopback registry ----------------


@dataclass
class RegistryDocker:
    """The Docker adapter, pushing gzip layers into the loopback registry, as dockerd does;
    records jobs and pushes."""

    registry: OCIRegistry
    server_version: str = "27.3.1"
    jobs: list[BuildJob] = field(default_factory=list)
    local: dict[str, ImageInfo] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    pushed: list[str] = field(default_factory=list)

    def build(self, job: BuildJob, progress: Progress) -> str:  # noqa: ARG002
        self.jobs.append(job)
        info = ImageInfo(f"sha256:{len(self.jobs)}", 100, ("layer",), ())
        for reference in job.references:
            self.local[reference] = info
            self.labels[reference] = dict(job.labels)
        return info.id

    def tag(self, image: str, reference: str) -> None:
        self.local[reference] = next(i for i in self.local.values() if i.id == image)

    def push(self, reference: str, progress: Progress) -> str:  # noqa: ARG002
        self.pushed.append(reference)
        tag = reference.rpartition(":")[2]
        arch = tag.rpartition("-")[2]
        layers = [tar_layer({"etc/os-release": b"ID=debian\n"}), tar_layer({"tag": tag.encode()})]
        self.registry.add_layered_image(NAME, [tag], layers, arch=arch,
                                        labels=self.labels.get(reference, {}))  # fmt: skip
        return self.registry.tags(NAME)[tag]

    def inspect(self, reference: str) -> ImageInfo:
        return self.local[reference]

    def exists(self, reference: str) -> bool:
        return reference in self.local

    def version(self) -> str:
        return self.server_version

    def read_files(self, reference: str, directory: str) -> dict[str, bytes]:  # noqa: ARG002
        kernel = "6.12.102-flatcar" if "6.12.102" in reference else "6.6.150-flatcar"
        return {"open/p/metadata.json": json.dumps({"kernel_release": kernel}).encode()}


@pytest.fixture
def c() -> MockContext:
    return MockContext(run={
        "git rev-parse HEAD": Result("0123abcd" * 5 + "\n"),
        "git remote get-url origin": Result("https://example.invalid/gdc.git\n"),
        "git log -1 --format=%cI": Result("2026-08-20T10:00:00+00:00\n"),
    })  # fmt: skip


def _redist_lines(arches: tuple[str, ...]) -> str:
    sums = ", ".join(f'{arch} = "{SUM}"' for arch in arches)
    return "".join(
        f'{component} = {{ version = "610.57.04", {sums} }}\n'
        for component in ("fabricmanager", "libnvidia_nscq")
    )


def _files(tmp_path: Path, arches: tuple[str, ...], feed: dict[str, Any] | None = None,
           pinned: tuple[str, ...] = ()) -> tuple[str, str]:  # fmt: skip
    versions = tmp_path / "versions.toml"
    sums = ", ".join(f'{arch} = "{SUM}"' for arch in arches)
    versions.write_text(f'[images]\nchannels = ["stable"]\narches = {list(arches)!r}\n'
                        f'pinned = {list(pinned)!r}\n'
                        f'[drivers."610.57.04"]\nsha256 = {{ {sums} }}\n'
                        f'[drivers."610.57.04".redist]\n{_redist_lines(arches)}')  # fmt: skip
    releases = tmp_path / "releases.json"
    releases.write_text(json.dumps(feed or feed_from_tsv()))
    return str(versions), releases.as_uri()


def test_invoke_publish_builds_each_arch_then_merges_the_tags(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    connected: list[bool] = []

    def connect(_host: str, multi: bool) -> RegistryDocker:
        connected.append(multi)
        return docker

    monkeypatch.setattr(cli_tasks, "connect_docker", connect)
    versions, feed = _files(tmp_path, ("amd64", "arm64"))
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  base_image="debian@sha256:" + "1" * 64)  # fmt: skip
    assert connected == [False]  # the classic builder, one arch per build
    assert [job.references for job in docker.jobs] == [
        (f"{registry.host}/{NAME}:610.57.04-flatcar-amd64",),
        (f"{registry.host}/{NAME}:610.57.04-flatcar-arm64",),
        (f"{registry.host}/{NAME}:610.57.04-6.12.102-flatcar-amd64",),
        (f"{registry.host}/{NAME}:610.57.04-6.12.102-flatcar-arm64",),
    ]
    build_job, _, precompiled_job, _ = docker.jobs
    assert build_job.buildargs["FLATCAR_VERSIONS"] == "4593.2.5"
    assert build_job.buildargs["TARGETARCH"] == "amd64"
    assert precompiled_job.buildargs["BUILD_IMAGE"] == (
        f"{registry.host}/{NAME}:610.57.04-flatcar-amd64")  # fmt: skip
    assert precompiled_job.buildargs["FLATCAR_VERSIONS"] == "4593.2.5"
    labels = precompiled_job.labels
    assert labels["org.opencontainers.image.base.name"] == precompiled_job.buildargs["BUILD_IMAGE"]
    assert labels["org.opencontainers.image.base.digest"] == registry.tags(NAME)[
        "610.57.04-flatcar-amd64"]  # fmt: skip
    assert labels["org.opencontainers.image.created"] == "2026-08-20T10:00:00+00:00"
    assert json.loads(build_job.labels[inputs.INPUTS_LABEL])["base"] == "sha256:" + "1" * 64
    assert Registry(registry.host).platforms(NAME, "610-6.12.102-flatcar-flatcar4593.2.5") == {
        "linux/amd64", "linux/arm64"}  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "built 2"
    assert out[-1].startswith("registry: ")
    docker.jobs.clear()
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  base_image="debian@sha256:" + "1" * 64)  # fmt: skip
    assert docker.jobs == []
    assert capsys.readouterr().out.splitlines()[-2] == "skipped 2"


def test_invoke_publish_refuses_a_dockerd_that_cannot_pull_zstd_before_any_build(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry, server_version="20.10.24+dfsg1")
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: docker)
    versions, feed = _files(tmp_path, ("amd64",))
    options = {"registry": f"{registry.host}/gdc", "versions_file": versions,
               "releases_url": feed, "base_image": PINNED}  # fmt: skip
    with pytest.raises(Exit) as error:
        tasks.publish(c, **options)
    assert str(error.value) == (
        "invoke publish: dockerd 20.10.24+dfsg1 cannot pull the zstd layers the precompiled "
        "images build on: use Docker Engine >= 23, or --compression gzip; nothing was built"
    )
    assert docker.jobs == []
    # gzip needs no zstd puller; a merge and a dry run ask no dockerd.
    tasks.publish(c, **options, compression="gzip")
    assert len(docker.jobs) == 2
    assert "built 2" in capsys.readouterr().out
    tasks.publish(c, **options, step="merge")
    tasks.publish(c, **options, dry_run=True)
    assert capsys.readouterr().out.count("\nskipped 2\n") == 2


def test_invoke_publish_exits_non_zero_after_a_failure(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)

    def broken_build(job: BuildJob, progress: Progress) -> str:
        raise DockerError("docker build failed: no space left on device\nmore")

    monkeypatch.setattr(docker, "build", broken_build)
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: docker)
    versions, feed = _files(tmp_path, ("amd64",))
    with pytest.raises(Exit, match=r"invoke publish: 2 of 2 images failed \(see the summary\)"):
        tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions,
                      releases_url=feed)  # fmt: skip
    assert "no space left on device" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ("missing", "cannot read the Flatcar releases feed"),
        ("{", "the Flatcar releases feed is not JSON"),
        ("{}", "the releases feed covers none of the channels versions.toml lists"),
        (
            '{"4593.2.5": {"channel": "stable", "major_software": {"kernel": ["6.12.102"]}}}',
            "covers none of the channels",
        ),
    ],
)
def test_feed_errors_are_one_line_and_nothing_is_built(  # noqa: PLR0917 - fixtures
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    feed: str, message: str,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: docker)
    versions, _ = _files(tmp_path, ("amd64",))
    url = (tmp_path / "nowhere.json").as_uri()
    if feed != "missing":
        (tmp_path / "feed.json").write_text(feed)
        url = (tmp_path / "feed.json").as_uri()
    with pytest.raises(Exit, match=message) as error:
        tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=url)
    assert str(error.value).endswith("; nothing was built")
    assert "\n" not in str(error.value)
    assert docker.jobs == []
    assert registry.log == []


def test_a_current_release_without_a_kernel_is_excluded_and_the_rest_published(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: docker)
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", None)
    versions, url = _files(tmp_path, ("amd64",), with_markers(feed), pinned=("4593.2.5",))
    # What can be published is, then the run fails: stable nodes have no image.
    with pytest.raises(Exit) as error:
        tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions,
                      releases_url=url, base_image="debian@sha256:" + "1" * 64)  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    excluded = [line for line in lines if line.startswith("excluded  ")]
    assert excluded[0].startswith("excluded  * * for Flatcar 4593.2.6 ")
    assert "Flatcar 4593.2.6 (stable) has no kernel in the releases feed" in excluded[0]
    assert lines[-2] == "built 2, excluded 1"
    assert str(error.value) == (
        "invoke publish: Flatcar 4593.2.6 (stable) has no kernel in the releases feed "
        "(major_software.kernel): its nodes get no image until the feed is fixed (report it to "
        "Flatcar); the first run after that publishes it"
    )
    # A stage job leaves saying so to the merge.
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=url,
                  base_image="debian@sha256:" + "1" * 64, step="stage")  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "--registry is required"),
        ({"registry": "ghcr.io/<owner>"}, "is not a valid repository"),
        ({"registry": "127.0.0.1:9/gdc", "step": "half"}, "unknown --step 'half'"),
        ({"registry": "127.0.0.1:9/gdc", "compression": "lz4"}, "--compression 'lz4' is not "),
        ({"registry": "127.0.0.1:9/gdc", "zstd_level": 23}, "--zstd-level 23 is out of range"),
    ],
)
def test_invoke_publish_checks_its_arguments_before_any_network(
    c: MockContext, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    versions = tmp_path / "versions.toml"
    versions.write_text('[drivers."610.57.04"]\nsha256 = { amd64 = "TODO" }\n')
    nowhere = "http://127.0.0.1:9/releases.json"  # would fail differently if it were read
    with pytest.raises(Exit, match=message):
        tasks.publish(c, versions_file=str(versions), releases_url=nowhere, **options)


def test_an_unreachable_registry_stops_the_run_up_front(c: MockContext, tmp_path: Path) -> None:
    versions, feed = _files(tmp_path, ("amd64",))
    with pytest.raises(Exit, match=r"cannot reach the registry 127\.0\.0\.1:9 .*nothing was "
                       "built") as error:  # fmt: skip
        tasks.publish(c, registry="127.0.0.1:9/gdc", versions_file=versions, releases_url=feed)
    assert "\n" not in str(error.value)


def test_invoke_matrix_prints_json_a_table_or_the_github_output(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions, feed = _files(tmp_path, ("amd64",))
    tasks.matrix_(MockContext(), json=True, versions_file=versions, releases_url=feed)
    document = json.loads(capsys.readouterr().out)
    assert [entry["id"] for entry in document["include"]] == [
        "build-610.57.04-amd64", "precompiled-610.57.04-6.12.102-flatcar-amd64"]  # fmt: skip
    assert document["arches"] == [
        {"arch": "amd64", "runner": "ubuntu-24.04", "group": "publish driver:<release tags> amd64"}
    ]
    tasks.matrix_(MockContext(), versions_file=versions, releases_url=feed)
    assert capsys.readouterr().out.startswith("Flatcar releases (1):\n")
    output = tmp_path / "github-output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    tasks.matrix_(MockContext(), github_output=True, versions_file=versions, releases_url=feed)
    assert output.read_text().startswith('json={"include":')
    with pytest.raises(Exit, match="invoke matrix: cannot read the Flatcar releases feed"):
        tasks.matrix_(MockContext(), github_output=True, releases_url=(tmp_path / "x").as_uri())
    assert output.read_text().count("json=") == 1


def _no_dockerd(_host: str, _multi: bool) -> RegistryDocker:
    raise DockerError("connecting to dockerd failed: no such file or directory")


def test_a_dry_run_needs_no_dockerd_and_prints_the_plan(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setattr(cli_tasks, "connect_docker", _no_dockerd)
    versions, feed = _files(tmp_path, ("amd64", "arm64"))
    # The Dockerfile's base image, pinned by digest.
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  dry_run=True)  # fmt: skip
    out = capsys.readouterr().out
    assert "dockerd" not in out
    assert "[1/2] would build in " in out
    assert ": amd64: not in the registry; arm64: not in the registry; then all 2 tags set" in out
    assert out.splitlines()[-2] == "would build 2"
    # A real run does need dockerd, and says so.
    with pytest.raises(Exit, match=r"connecting to dockerd failed: .*; nothing was built"):
        tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions,
                      releases_url=feed)  # fmt: skip
    # Once published, a base image by tag has no digest to compare without dockerd: each build
    # image says so for each arch (in its progress line and in the summary), and the plan goes on.
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: RegistryDocker(registry))
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  base_image=PINNED)  # fmt: skip
    monkeypatch.setattr(cli_tasks, "connect_docker", _no_dockerd)
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  dry_run=True, base_image=PINNED)  # fmt: skip
    assert capsys.readouterr().out.splitlines()[-2] == "skipped 2"
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed,
                  dry_run=True, base_image="debian:trixie-slim")  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("the base image debian:trixie-slim is not pinned by digest and a dry run "
                     "asks no dockerd, so whether it changed is unknown: pin it") == 4  # fmt: skip
    assert "arm64: its build image would be built first" in out
    assert out.splitlines()[-2] == "would build 2"


def test_a_dry_run_fails_where_the_real_run_would_a_checksum_still_todo(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setattr(cli_tasks, "connect_docker", _no_dockerd)
    versions, feed = _files(tmp_path, ("amd64",))
    path = Path(versions)
    path.write_text(path.read_text().replace(f'sha256 = {{ amd64 = "{SUM}" }}',
                                             'sha256 = { amd64 = "TODO" }'))  # fmt: skip
    with pytest.raises(Exit, match=r"2 of 2 images would fail"):
        tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions,
                      releases_url=feed, dry_run=True, base_image=PINNED)  # fmt: skip
    assert "no SHA-256 recorded for NVIDIA-Linux-*-610.57.04.run on amd64" in (
        capsys.readouterr().out)  # fmt: skip


def test_invoke_publish_checks_the_retry_budget_before_any_network(c: MockContext) -> None:
    with pytest.raises(Exit, match="--retry-budget -1 is negative"):
        tasks.publish(c, registry="127.0.0.1:9/gdc", retry_budget=-1,
                      releases_url="http://127.0.0.1:9/releases.json")  # fmt: skip
