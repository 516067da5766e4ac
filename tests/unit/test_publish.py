"""invoke publish against a loopback registry: what gets built, tagged, skipped or fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tasks
from flatcar_feed import feed_entry, feed_from_tsv, with_markers
from invoke.context import MockContext
from invoke.exceptions import Exit
from invoke.runners import Result
from oci_registry import OCIRegistry

from gdc import matrix, publish
from gdc.docker_api import BuildJob, DockerError, ImageInfo, Progress
from gdc.publish import Action, Image, Status
from gdc.registry import Registry, Repository
from gdc.tags import Variant
from gdc.versions import Versions, parse_versions

SUM = "ab" * 32
NAME = "gdc/driver"
BUILD = "610.57.04-flatcar"


def _versions(arches: tuple[str, ...] = ("amd64", "arm64"), sums: bool = True) -> Versions:
    checksums = dict.fromkeys(arches, SUM if sums else "TODO")
    return parse_versions({
        "images": {"channels": ["stable", "lts"], "arches": list(arches)},
        "drivers": {"610.57.04": {"sha256": checksums}},
    })  # fmt: skip


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as server:
        yield server


@dataclass
class FakeBuilder:
    """Pushes a made-up image with every tag and arch, as a buildx build would."""

    registry: OCIRegistry
    built: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)  # first tags whose build fails

    def __call__(self, image: Image, build_image: str) -> None:
        first = image.tags.tags[0]
        self.built.append(first)
        if first in self.failing:
            raise DockerError("docker build failed: returned a non-zero code: 2\nStep 3/9 : RUN")
        if image.variant is Variant.PRECOMPILED:
            assert build_image == f"{self.registry.host}/{NAME}:{BUILD}"
            assert BUILD in self.registry.tags(NAME)
        self.registry.add_image(NAME, list(image.tags.tags), image.arches, label=first)


def _matrix(registry: OCIRegistry, feed: dict[str, Any] | None = None,
            versions: Versions | None = None) -> matrix.Matrix:  # fmt: skip
    feed_text = json.dumps(feed or feed_from_tsv())
    return matrix.build_matrix(feed_text, versions or _versions(), registry=f"{registry.host}/gdc")


def _publish(registry: OCIRegistry, builder: FakeBuilder, covered: matrix.Matrix,
             dry_run: bool = False) -> tuple[list[publish.Outcome], list[str]]:  # fmt: skip
    said: list[str] = []
    repository = Repository(registry.host, NAME)
    outcomes = publish.publish(covered, Registry(registry.host), repository, builder,
                               dry_run=dry_run, say=said.append)  # fmt: skip
    return outcomes, said


def _statuses(outcomes: list[publish.Outcome]) -> list[tuple[str, str]]:
    return [(o.image.tags.tags[0], o.status.value) for o in outcomes]


def test_images_group_the_arches_of_one_tag_set_build_images_first(
    registry: OCIRegistry,
) -> None:
    images = publish.images_of(_matrix(registry))
    assert [(i.variant.value, i.tags.tags[0], i.arches) for i in images] == [
        ("build", BUILD, ("amd64", "arm64")),
        ("precompiled", "610.57.04-flatcar4081.3.10", ("amd64", "arm64")),
        ("precompiled", "610.57.04-flatcar4593.2.5", ("amd64", "arm64")),
    ]


def test_from_empty_everything_is_built_and_a_second_run_builds_nothing(
    registry: OCIRegistry,
) -> None:
    builder = FakeBuilder(registry)
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert _statuses(outcomes) == [
        (BUILD, "built"),
        ("610.57.04-flatcar4081.3.10", "built"),
        ("610.57.04-flatcar4593.2.5", "built"),
    ]
    assert outcomes[0].digest == registry.tags(NAME)[BUILD]
    assert set(registry.tags(NAME)) == {
        BUILD, f"{BUILD}-flatcar4081.3.10", f"{BUILD}-flatcar4593.2.5",
        "610.57.04-flatcar4081.3.10", "610-6.6.150-flatcar-flatcar4081.3.10",
        "610.57.04-flatcar4593.2.5", "610-6.12.102-flatcar-flatcar4593.2.5",
    }  # fmt: skip
    builder.built.clear()
    again, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    assert {o.status for o in again} == {Status.SKIPPED}
    assert [method for method, _, _ in registry.log[-3:]] == ["HEAD", "HEAD", "GET"]


def test_a_new_release_adds_a_build_image_alias_and_builds_only_its_image(
    registry: OCIRegistry,
) -> None:
    builder = FakeBuilder(registry)
    _publish(registry, builder, _matrix(registry))
    build_digest = registry.tags(NAME)[BUILD]
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", "6.12.110")
    builder.built.clear()
    outcomes, _ = _publish(registry, builder, _matrix(registry, with_markers(feed)))
    assert builder.built == ["610.57.04-flatcar4593.2.6"]
    assert _statuses(outcomes) == [
        (BUILD, "tagged"),
        ("610.57.04-flatcar4081.3.10", "skipped"),
        ("610.57.04-flatcar4593.2.6", "built"),
    ]
    assert outcomes[0].detail == f"added {BUILD}-flatcar4593.2.6"
    assert registry.tags(NAME)[f"{BUILD}-flatcar4593.2.6"] == build_digest  # no rebuild
    puts = [path for method, path, _ in registry.log if method == "PUT"]
    assert puts == [f"/v2/{NAME}/manifests/{BUILD}-flatcar4593.2.6"]


def test_an_image_lacking_an_arch_is_rebuilt(registry: OCIRegistry) -> None:
    covered = _matrix(registry)
    for image in publish.images_of(covered):
        registry.add_image(NAME, list(image.tags.tags), ("amd64",))
    builder = FakeBuilder(registry)
    outcomes, _ = _publish(registry, builder, covered)
    assert builder.built == [BUILD, "610.57.04-flatcar4081.3.10", "610.57.04-flatcar4593.2.5"]
    assert outcomes[0].detail == f"{BUILD} lacks linux/arm64"


def test_a_failure_is_recorded_and_the_run_goes_on(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry, failing={"610.57.04-flatcar4081.3.10"})
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert _statuses(outcomes) == [
        (BUILD, "built"),
        ("610.57.04-flatcar4081.3.10", "failed"),
        ("610.57.04-flatcar4593.2.5", "built"),
    ]
    assert outcomes[1].detail == (
        "610.57.04-flatcar4081.3.10 not in the registry; build failed: docker build failed: "
        "returned a non-zero code: 2"
    )
    assert publish.failures(outcomes) == [outcomes[1]]
    builder.failing.clear()
    builder.built.clear()
    rerun, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == ["610.57.04-flatcar4081.3.10"]
    assert publish.failures(rerun) == []


def test_precompiled_images_fail_with_their_build_image(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry, failing={BUILD})
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == [BUILD]
    assert [o.status for o in outcomes] == [Status.FAILED] * 3
    assert outcomes[2].detail == (
        f"610.57.04-flatcar4593.2.5 not in the registry, and its build image "
        f"{registry.host}/{NAME}:{BUILD} failed"
    )


def test_a_driver_without_a_checksum_fails_before_building(registry: OCIRegistry) -> None:
    builder = FakeBuilder(registry)
    outcomes, _ = _publish(registry, builder, _matrix(registry, versions=_versions(sums=False)))
    assert builder.built == []
    assert outcomes[0].status is Status.FAILED
    assert outcomes[0].detail.startswith(f"{BUILD} not in the registry, and cannot be built: "
                                         "no SHA-256 recorded")  # fmt: skip


def test_a_registry_error_fails_each_image_with_its_reason(registry: OCIRegistry) -> None:
    registry.status = 500
    builder = FakeBuilder(registry)
    outcomes, _ = _publish(registry, builder, _matrix(registry))
    assert builder.built == []
    assert {o.status for o in outcomes} == {Status.FAILED}
    assert "answered HEAD gdc/driver:610.57.04-flatcar with 500" in outcomes[0].detail


def test_the_plan_for_each_image(registry: OCIRegistry) -> None:
    client, repository = Registry(registry.host), Repository(registry.host, NAME)
    build, old, new = publish.images_of(_matrix(registry))
    registry.add_image(NAME, list(build.tags.tags[:2]), ("amd64", "arm64"))
    registry.add_image(NAME, [build.tags.tags[2]], ("amd64", "arm64"), label="older")
    registry.add_image(NAME, list(old.tags.tags), ("amd64", "arm64"))
    step = publish.plan_image(build, client, repository)
    assert (step.action, step.tags) == (Action.TAG, (build.tags.tags[2],))
    assert step.reason == "1 tag(s) missing or pointing elsewhere"
    assert publish.plan_image(old, client, repository).action is Action.SKIP
    step = publish.plan_image(new, client, repository)
    assert (step.action, step.tags) == (Action.BUILD, new.tags.tags)


def test_a_dry_run_prints_the_plan_and_changes_nothing(registry: OCIRegistry) -> None:
    covered = _matrix(registry)
    build = publish.images_of(covered)[0]
    registry.add_image(NAME, [build.tags.tags[0]], ("amd64", "arm64"))
    builder = FakeBuilder(registry)
    outcomes, said = _publish(registry, builder, covered, dry_run=True)
    assert builder.built == []
    assert [method for method, _, _ in registry.log if method == "PUT"] == []
    repository = f"{registry.host}/{NAME}"
    assert said == [
        f"tag: {repository}:{BUILD} (2 tag(s) missing)",
        *(
            f"build: {repository}:{image} ({image} not in the registry)"
            for image in ("610.57.04-flatcar4081.3.10", "610.57.04-flatcar4593.2.5")
        ),
    ]
    assert publish.failures(outcomes) == []
    table = publish.summary(outcomes, covered.excluded, repository).splitlines()
    assert table[1].split() == ["STATUS", "IMAGE", "ARCHES", "TAG", "DETAIL"]
    assert table[2].startswith("would tag    build 610.57.04  ")
    assert table[-1] == "would tag 1, would build 2"


def test_the_summary_lists_outcomes_exclusions_and_counts(registry: OCIRegistry) -> None:
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", None)
    covered = _matrix(registry, with_markers(feed))
    builder = FakeBuilder(registry, failing={"610.57.04-flatcar4081.3.10"})
    outcomes, _ = _publish(registry, builder, covered)
    lines = publish.summary(outcomes, covered.excluded, "r/driver").splitlines()
    assert lines[0] == "Summary for r/driver:"
    assert lines[1].split() == ["STATUS", "IMAGE", "ARCHES", "TAG", "DETAIL"]
    assert lines[3].endswith(
        "  610.57.04-flatcar4081.3.10  610.57.04-flatcar4081.3.10 not in the registry; build "
        "failed: docker build failed: returned a non-zero code: 2"
    )
    assert lines[2].split()[:3] == ["built", "build", "610.57.04"]
    assert lines[3].split()[:2] == ["failed", "precompiled"]
    assert lines[4].startswith("excluded  * * for Flatcar 4593.2.6")
    assert "has no kernel in the releases feed" in lines[4]
    assert lines[-1] == "built 1, failed 1, excluded 1"


# --- through invoke, with a fake dockerd that pushes into the loopback registry ----------------


@dataclass
class RegistryDocker:
    """The Docker adapter, pushing into the loopback registry; records jobs and pushes."""

    registry: OCIRegistry
    jobs: list[BuildJob] = field(default_factory=list)
    local: dict[str, ImageInfo] = field(default_factory=dict)
    pushed: list[str] = field(default_factory=list)

    def build(self, job: BuildJob, progress: Progress) -> str:  # noqa: ARG002
        self.jobs.append(job)
        info = ImageInfo(f"sha256:{len(self.jobs)}", 100, ("layer",), ())
        if len(job.platforms) > 1:  # buildx: pushed as built
            tags = [reference.rpartition(":")[2] for reference in job.references]
            arches = tuple(platform.removeprefix("linux/") for platform in job.platforms)
            self.registry.add_image(NAME, tags, arches)
            return ""
        for reference in job.references:
            self.local[reference] = info
        return info.id

    def tag(self, image: str, reference: str) -> None:
        self.local[reference] = next(i for i in self.local.values() if i.id == image)

    def push(self, reference: str, progress: Progress) -> str:  # noqa: ARG002
        self.pushed.append(reference)
        self.registry.add_image(NAME, [reference.rpartition(":")[2]], ("amd64",), index=False)
        return self.registry.tags(NAME)[reference.rpartition(":")[2]]

    def inspect(self, reference: str) -> ImageInfo:
        return self.local[reference]

    def exists(self, reference: str) -> bool:
        return reference in self.local

    def read_files(self, reference: str, directory: str) -> dict[str, bytes]:  # noqa: ARG002
        kernel = "6.12.102-flatcar" if "4593" in reference else "6.6.150-flatcar"
        return {"open/p/metadata.json": json.dumps({"kernel_release": kernel}).encode()}


@pytest.fixture
def c() -> MockContext:
    return MockContext(run={
        "git rev-parse HEAD": Result("0123abcd" * 5 + "\n"),
        "git remote get-url origin": Result("https://example.invalid/gdc.git\n"),
    })  # fmt: skip


def _files(tmp_path: Path, arches: tuple[str, ...], feed: dict[str, Any] | None = None) -> (
    tuple[str, str]
):  # fmt: skip
    versions = tmp_path / "versions.toml"
    sums = ", ".join(f'{arch} = "{SUM}"' for arch in arches)
    versions.write_text(f'[images]\nchannels = ["stable"]\narches = {list(arches)!r}\n'
                        f'[drivers."610.57.04"]\nsha256 = {{ {sums} }}\n')  # fmt: skip
    releases = tmp_path / "releases.json"
    releases.write_text(json.dumps(feed or feed_from_tsv()))
    return str(versions), releases.as_uri()


def test_invoke_publish_builds_with_the_docker_sdk_for_one_arch(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    monkeypatch.setattr(tasks, "connect_docker", lambda _host, _multi: docker)
    versions, feed = _files(tmp_path, ("amd64",))
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed)
    build_job, precompiled_job = docker.jobs
    assert build_job.platforms == ("linux/amd64",)
    assert build_job.buildargs["FLATCAR_VERSIONS"] == "4593.2.5"
    assert precompiled_job.buildargs["BUILD_IMAGE"] == f"{registry.host}/{NAME}:{BUILD}"
    assert [ref.rpartition(":")[2] for ref in docker.pushed] == [
        BUILD, f"{BUILD}-flatcar4593.2.5",
        "610.57.04-flatcar4593.2.5", "610-6.12.102-flatcar-flatcar4593.2.5",
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "built 2"
    docker.jobs.clear()
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed)
    assert docker.jobs == []
    assert capsys.readouterr().out.splitlines()[-1] == "skipped 2"


def test_invoke_publish_builds_several_arches_with_buildx(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    multi_arch: list[bool] = []

    def connect(_host: str, multi: bool) -> RegistryDocker:
        multi_arch.append(multi)
        return docker

    monkeypatch.setattr(tasks, "connect_docker", connect)
    versions, feed = _files(tmp_path, ("amd64", "arm64"))
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=feed)
    assert multi_arch == [True, True]
    assert [job.platforms for job in docker.jobs] == [("linux/amd64", "linux/arm64")] * 2
    assert docker.pushed == []
    assert Registry(registry.host).platforms(NAME, "610.57.04-flatcar4593.2.5") == {
        "linux/amd64", "linux/arm64"}  # fmt: skip


def test_invoke_publish_exits_non_zero_after_a_failure(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)

    def broken_build(job: BuildJob, progress: Progress) -> str:
        raise DockerError("docker build failed: no space left on device\nmore")

    monkeypatch.setattr(docker, "build", broken_build)
    monkeypatch.setattr(tasks, "connect_docker", lambda _host, _multi: docker)
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
        (
            '{"4593.2.5": {"channel": "stable", "major_software": {"kernel": ["6.12.102"]}}}',
            "release 4593.2.5: architectures is not a list of names",
        ),
    ],
)
def test_feed_errors_are_one_line_and_nothing_is_built(  # noqa: PLR0917 - fixtures
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    feed: str, message: str,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    monkeypatch.setattr(tasks, "connect_docker", lambda _host, _multi: docker)
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


def test_a_current_release_without_a_kernel_is_excluded_and_nothing_built(
    c: MockContext, registry: OCIRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    docker = RegistryDocker(registry)
    monkeypatch.setattr(tasks, "connect_docker", lambda _host, _multi: docker)
    feed = with_markers({"4593.2.6": feed_entry("stable", "2026-09-10", None)})
    versions, url = _files(tmp_path, ("amd64",), feed)
    tasks.publish(c, registry=f"{registry.host}/gdc", versions_file=versions, releases_url=url)
    assert docker.jobs == []
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("excluded  * * for Flatcar 4593.2.6  *       -    Flatcar 4593.2.6 "
                                "(stable) has no kernel in the releases feed")  # fmt: skip
    assert lines[-1] == "excluded 1"


def test_invoke_publish_needs_a_registry_host(c: MockContext, tmp_path: Path) -> None:
    versions, feed = _files(tmp_path, ("amd64",))
    with pytest.raises(Exit, match=r"pass --registry with one, e\.g\. ghcr\.io/<owner>"):
        tasks.publish(c, versions_file=versions, releases_url=feed)


def test_invoke_matrix_prints_json_or_a_table(tmp_path: Path, capsys: Any) -> None:
    versions, feed = _files(tmp_path, ("amd64",))
    tasks.matrix_(MockContext(), json=True, versions_file=versions, releases_url=feed)
    document = json.loads(capsys.readouterr().out)
    assert [entry["id"] for entry in document["include"]] == [
        "build-610.57.04-amd64", "precompiled-610.57.04-4593.2.5-amd64"]  # fmt: skip
    tasks.matrix_(MockContext(), versions_file=versions, releases_url=feed)
    assert capsys.readouterr().out.startswith("Flatcar releases (1):\n")
    with pytest.raises(Exit, match="invoke matrix: cannot read the Flatcar releases feed"):
        tasks.matrix_(MockContext(), releases_url=(tmp_path / "none.json").as_uri())
