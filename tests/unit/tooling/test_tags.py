"""Image tags as the GPU Operator asks for them, and the build jobs that carry them."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gdc import context, images, inputs, tags
from gdc.docker_api import HistoryEntry, ImageInfo
from gdc.plan import BuildSettings, Request, Upstream
from gdc.tags import (
    ImageTags,
    TagError,
    Variant,
    build_image_tags,
    kernel_in_tag,
    os_tag,
    precompiled_tags,
    repository,
)
from gdc.versions import Driver, RedistDigests, VersionsError
from nvidia_driver.sources.flatcar import FlatcarVersion, Release

SUM = "cd" * 32


def test_the_os_tag_is_id_and_full_version_id() -> None:
    # The Operator shortens VERSION_ID only for rhel, rocky and ol.
    assert os_tag("4593.2.0") == "flatcar4593.2.0"
    with pytest.raises(TagError, match=r"expected e\.g\. 4593\.2\.0"):
        os_tag("stable")


def test_precompiled_tags_serve_both_operator_paths() -> None:
    """driver.version=<driver> (default path) and <branch> with usePrecompiled."""
    assert precompiled_tags("580.178.04", ["4593.2.0"], "6.12.81-flatcar") == (
        "580.178.04-flatcar4593.2.0",
        "580-6.12.81-flatcar-flatcar4593.2.0",
    )


def test_a_kernel_image_is_tagged_for_its_releases_and_every_os_tag() -> None:
    """usePrecompiled gives every per-kernel DaemonSet the first GPU node's OS tag."""
    tags = precompiled_tags("580.178.04", ["4593.2.5", "4757.1.0"], "6.12.102-flatcar",
                            ["4081.3.10", "4593.2.5", "4757.1.0"])  # fmt: skip
    assert tags == (
        "580.178.04-flatcar4593.2.5",
        "580.178.04-flatcar4757.1.0",
        "580-6.12.102-flatcar-flatcar4081.3.10",
        "580-6.12.102-flatcar-flatcar4593.2.5",
        "580-6.12.102-flatcar-flatcar4757.1.0",
    )


def test_the_build_image_gets_one_alias_per_supported_release() -> None:
    assert build_image_tags("595.91.07", ["4593.2.0", "4628.1.0", "4593.2.0"]) == (
        "595.91.07-flatcar",
        "595.91.07-flatcar-flatcar4593.2.0",
        "595.91.07-flatcar-flatcar4628.1.0",
    )


def test_a_prefix_goes_in_front_of_every_tag() -> None:
    prefix = "flatcar-test-5b98d7b9"
    assert build_image_tags("580.178.04", ["4593.2.0"], prefix) == (
        "flatcar-test-5b98d7b9-580.178.04-flatcar",
        "flatcar-test-5b98d7b9-580.178.04-flatcar-flatcar4593.2.0",
    )
    assert precompiled_tags("580.178.04", ["4593.2.0"], "6.12.81-flatcar", (), prefix + "-")[0] == (
        "flatcar-test-5b98d7b9-580.178.04-flatcar4593.2.0"
    )


@pytest.mark.parametrize("prefix", ["-dash", "has space", "a/b", "x" * 120])
def test_a_prefix_a_registry_would_refuse_is_refused(prefix: str) -> None:
    with pytest.raises(TagError):
        build_image_tags("580.178.04", [], prefix)


def test_a_kernel_release_is_made_fit_for_a_tag() -> None:
    assert kernel_in_tag("6.12.81-flatcar") == "6.12.81-flatcar"
    assert kernel_in_tag("6.12.95+deb12-cloud-amd64") == "6.12.95-deb12-cloud-amd64"


def test_repository_joins_like_driver_repository_and_image() -> None:
    assert repository("") == "driver"
    assert repository("ghcr.io/me/") == "ghcr.io/me/driver"
    assert repository("127.0.0.1:5000/gdc", "nvdriver") == "127.0.0.1:5000/gdc/nvdriver"
    tags = ImageTags("r/driver", ("a", "b"))
    assert tags.primary == "r/driver:a"
    assert tags.references == ("r/driver:a", "r/driver:b")


# --- build jobs --------------------------------------------------------------------------------


# The archives every image needs (the fabric manager and NSCQ), recorded for both arches.
REDIST = tuple(
    RedistDigests(component, "580.178.04", {"amd64": "12" * 32, "arm64": "34" * 32})
    for component in ("fabricmanager", "libnvidia_nscq")
)


def _request(
    variant: Variant = Variant.PRECOMPILED, arches: tuple[str, ...] = ("amd64",)
) -> Request:
    release = Release(
        FlatcarVersion.parse("4593.2.5"),
        "stable",
        "6.12.102-flatcar",
        ("amd64", "arm64"),
        datetime(2026, 8, 13, tzinfo=UTC),
    )
    return Request(
        variant=variant,
        driver=Driver("580.178.04", {"amd64": SUM, "arm64": "ef" * 32}, REDIST),
        flatcar=release,
        aliases=("4593.2.5", "4757.1.0"),
        arches=arches,
        settings=BuildSettings(
            registry="127.0.0.1:5000/gdc",
            prefix="flatcar-test-0123abcd",
            upstream=Upstream(
                base_image="gdc/debian:trixie", release_base_url="http://m/{channel}"
            ),
            git_commit="0123abcd" * 5,
        ),
    )


def test_planned_tags_of_a_precompiled_build() -> None:
    build, precompiled = images.planned_tags(_request())
    repo = "127.0.0.1:5000/gdc/driver"
    assert build.references == (
        f"{repo}:flatcar-test-0123abcd-580.178.04-flatcar",
        f"{repo}:flatcar-test-0123abcd-580.178.04-flatcar-flatcar4593.2.5",
        f"{repo}:flatcar-test-0123abcd-580.178.04-flatcar-flatcar4757.1.0",
    )
    assert precompiled.references == (
        f"{repo}:flatcar-test-0123abcd-580.178.04-flatcar4593.2.5",
        f"{repo}:flatcar-test-0123abcd-580-6.12.102-flatcar-flatcar4593.2.5",
    )


BASE = images.Base("gdc/debian:trixie", "sha256:" + "1" * 64)


def test_the_build_job_passes_what_the_dockerfile_declares(tmp_path: Path) -> None:
    ctx = context.assemble(Variant.BUILD, tmp_path / "ctx")
    job = images.build_job(_request(), ctx, BASE)
    declared = (ctx.directory / ctx.dockerfile).read_text()
    for key in job.buildargs:
        assert f"ARG {key}" in declared, key
    assert job.buildargs["DRIVER_SHA256"] == f"amd64={SUM}"
    assert job.buildargs["TARGETARCH"] == "amd64"
    assert job.buildargs["DRIVER_BRANCH"] == "580"
    assert job.buildargs["BASE_IMAGE"] == "gdc/debian:trixie"
    assert "DRIVER_BASE_URL" not in job.buildargs  # empty: the Dockerfile's default (NVIDIA's)
    assert job.platforms == ("linux/amd64",)
    assert job.references[0].endswith(":flatcar-test-0123abcd-580.178.04-flatcar")


def test_a_multi_arch_job_leaves_targetarch_to_buildx(tmp_path: Path) -> None:
    ctx = context.assemble(Variant.BUILD, tmp_path / "ctx")
    job = images.build_job(_request(arches=("amd64", "arm64")), ctx, BASE)
    assert "TARGETARCH" not in job.buildargs
    assert job.buildargs["DRIVER_SHA256"] == f"amd64={SUM},arm64={'ef' * 32}"
    assert job.platforms == ("linux/amd64", "linux/arm64")


def test_the_build_context_holds_only_what_the_dockerfile_copies(tmp_path: Path) -> None:
    ctx = context.assemble(Variant.BUILD, tmp_path / "ctx")
    top = sorted(p.name for p in ctx.directory.iterdir())
    assert top == ["LICENSE", "NOTICE", "entrypoint", "images"]
    assert (ctx.directory / "entrypoint/src/nvidia_driver/cli.py").is_file()
    assert not list(ctx.directory.rglob("__pycache__"))
    again = context.assemble(Variant.BUILD, tmp_path / "again")
    assert inputs.context_digests(ctx.directory) == inputs.context_digests(again.directory)


def test_a_precompiled_job_with_a_mirror_keyring(tmp_path: Path) -> None:
    keyring = tmp_path / "mirror.gpg"
    keyring.write_bytes(b"\x99keyring")
    ctx = context.assemble(Variant.PRECOMPILED, tmp_path / "ctx", keyring)
    assert (ctx.directory / "keyrings/mirror.gpg").read_bytes() == b"\x99keyring"
    base = images.Base("local/driver:580.178.04-flatcar", "sha256:" + "2" * 64)
    job = images.precompiled_job(_request(), ctx, base)
    assert job.buildargs == {
        "BUILD_IMAGE": "local/driver:580.178.04-flatcar",
        "FLATCAR_VERSIONS": "4593.2.5",
        "FLATCAR_RELEASE_BASE_URL": "http://m/{channel}",
        "FLATCAR_KEYRING": "/etc/gdc/keyrings/mirror.gpg",
        "SEED_IMAGE": "local/driver:580.178.04-flatcar",  # no image to reuse packages of
    }
    # The image it replaces seeds its packages; that is no build input (nothing to rebuild).
    seeded = images.precompiled_job(_request(), ctx, base, seed="local/driver@sha256:" + "3" * 64)
    assert seeded.buildargs["SEED_IMAGE"] == "local/driver@sha256:" + "3" * 64
    assert seeded.labels == job.labels
    # The kernel tag waits for the image to say which kernel its packages are for.
    assert len(job.references) == 1
    assert job.labels["org.opencontainers.image.base.digest"] == base.digest
    recorded = json.loads(job.labels["gpu-driver-container.build-inputs"])
    assert recorded["releases"] == "4593.2.5"
    assert recorded["base"] == base.digest


def test_the_precompiled_dockerfile_adds_one_layer_to_the_build_image() -> None:
    dockerfile = (context.ROOT / "images/precompiled/Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    instructions = [
        line.split()[0] for line in final_stage.splitlines()[1:] if line and line[0].isalpha()
    ]
    assert final_stage.startswith("${BUILD_IMAGE}\n")
    assert instructions == ["ARG", "LABEL", "COPY"]  # ARG and LABEL write no layer


class _Files:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def read_files(self, _reference: str, directory: str) -> dict[str, bytes]:
        assert directory == images.PRECOMPILED_DIR
        return self.files


def _metadata(kernel: str) -> bytes:
    return json.dumps({"kernel_release": kernel}).encode()


def test_the_kernel_tag_comes_from_the_packages_in_the_image() -> None:
    files = {
        "open/nvidia-modules-6.12.102/metadata.json": _metadata("6.12.102-flatcar"),
        "proprietary/nvidia-modules-6.12.102/metadata.json": _metadata("6.12.102-flatcar"),
        "open/nvidia-modules-6.12.102/nvidia.ko": b"\x7fELF",
    }
    assert images.kernel_of(_Files(files), "x") == "6.12.102-flatcar"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"a/metadata.json": _metadata("6.12.1-flatcar"), "b/metadata.json": _metadata("6.6.1")},
    ],
)
def test_an_image_without_exactly_one_kernel_is_refused(files: dict[str, bytes]) -> None:
    with pytest.raises(images.DockerError, match="expected packages for one kernel"):
        images.kernel_of(_Files(files), "x")  # type: ignore[arg-type]


def test_the_report_shows_sizes_and_what_the_precompiled_image_adds() -> None:
    base = ImageInfo(
        "sha256:b",
        700_000_000,
        ("l1", "l2"),
        (
            HistoryEntry("/bin/sh -c #(nop) ENV A=1", 0),
            HistoryEntry("|2 A=1 B=x y /bin/sh -c apt", 90_000),
        ),
    )
    top = ImageInfo("sha256:p", 730_500_000, ("l1", "l2", "l3"), (HistoryEntry("COPY", 30_500),))
    lines: list[str] = []
    images.report(
        [
            images.Built(ImageTags("d", ("580.178.04-flatcar",)), base),
            images.Built(ImageTags("d", ("580.178.04-flatcar4593.2.5",)), top),
        ],
        lines.append,
    )
    assert "d:580.178.04-flatcar" in lines
    assert "  image 700.0 MB in 2 layers" in lines
    assert "      90.0 kB  apt" in lines
    assert not any("ENV" in line for line in lines)
    assert lines[-1] == "  shares 2 of the build image's 2 layers and adds 1 (30.5 MB)"


def test_human_sizes() -> None:
    assert images.human_size(999) == "999 B"
    assert images.human_size(1_500_000_000) == "1.5 GB"


@pytest.mark.parametrize(
    ("env", "prefix"),
    [
        (
            {"GITHUB_REF_TYPE": "branch", "GITHUB_SHA": "0123456789abcdef" * 2},
            "flatcar-test-01234567",
        ),
        ({"GITHUB_REF_TYPE": "tag", "GITHUB_SHA": "0123456789abcdef" * 2}, ""),
    ],
)
def test_the_ci_prefix_marks_branch_builds_only(env: dict[str, str], prefix: str) -> None:
    assert tags.ci_prefix(env) == prefix


def test_the_ci_prefix_outside_ci_says_to_pass_one() -> None:
    with pytest.raises(tags.TagError, match="outside CI, pass --prefix instead"):
        tags.ci_prefix({})


def test_repositories_are_lower_case_as_registries_require() -> None:
    assert tags.repository("ghcr.io/MyOrg") == "ghcr.io/myorg/driver"


@pytest.mark.parametrize("given", ["", SUM, f"amd64={SUM}", f"amd64={SUM},arm64={'ef' * 32}"])
def test_one_checksum_one_build_argument_however_it_was_given(given: str) -> None:
    # The same inputs must give the same DRIVER_SHA256, or Docker's layer cache is missed.
    request = dataclasses.replace(_request(), driver_sha256=given)
    assert request.sha256_spec == f"amd64={SUM}"


def test_a_checksum_list_without_an_arch_built_is_refused_before_docker() -> None:
    request = dataclasses.replace(_request(arches=("amd64", "arm64")), driver_sha256=f"amd64={SUM}")
    with pytest.raises(VersionsError, match=r"gives no checksum for arm64, .* add arm64=<sha256>"):
        request.sha256_spec  # noqa: B018 - worked out when first read
