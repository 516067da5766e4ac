"""invoke tags, build and push with MockContext and a fake Docker: no dockerd, no network."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tasks
import urllib3.exceptions
from docker.errors import APIError
from invoke.context import MockContext
from invoke.exceptions import Exit
from invoke.runners import Result

from gdc import cli_tasks, docker_api
from gdc.docker_api import BuildJob, Buildx, ImageInfo, Progress
from gdc.versions import Driver, load_versions

SUM = "ab" * 32
BASE = "gdc/debian:trixie@sha256:" + "1" * 64
# The newest driver's redist archives whose digests versions.toml does not record yet.
REDIST = (
    f"nvlsm.amd64={SUM},imex.amd64={SUM},libnvsdm.amd64={SUM},nvlsm.arm64={SUM},imex.arm64={SUM}"
)
# ... and those it does (AUR PKGBUILDs, see versions.toml).
RECORDED_AMD64 = (
    "fabricmanager.amd64=63ddfbe4ae21473568a36fe83c35201fcada5ebabfb6db45feeefa0091bd1dbb",
    "libnvidia_nscq.amd64=6922ac55e9c6167c68649383c4a1b2a5914b373142af2a8e535dbd83be1ef286",
)
KERNEL = "6.12.102-flatcar"
NEWEST = "610.57.04"


def _entry(channel: str, released: str, kernel: str) -> dict[str, Any]:
    return {
        "channel": channel,
        "architectures": ["amd64", "arm64"],
        "release_date": released,
        "major_software": {"kernel": [kernel]},
    }


@pytest.fixture
def feed_url(tmp_path: Path) -> str:
    """A releases.json with a current stable, beta, alpha and one LTS stream."""
    feed = {
        "4593.2.4": _entry("stable", "2026-07-09 10:57:13 +0000", "6.12.95"),
        "4593.2.5": _entry("stable", "2026-08-13 09:26:25 +0000", "6.12.102"),
        "4757.1.0": _entry("beta", "2026-08-13 09:20:44 +0000", "6.12.102"),
        "4790.0.0": _entry("alpha", "2026-08-13 09:23:30 +0000", "6.12.102"),
        "4081.3.10": _entry("lts", "2026-08-13 09:14:05 +0000", "6.6.150"),
    }
    feed["current"] = feed["4593.2.5"]
    feed["current-2024"] = feed["4081.3.10"]
    path = tmp_path / "releases.json"
    path.write_text(json.dumps(feed))
    return path.as_uri()


@dataclass
class FakeDocker:
    """Records what the tasks ask of dockerd; a precompiled image adds one layer to its base."""

    kernel: str = KERNEL
    jobs: list[BuildJob] = field(default_factory=list)
    images: dict[str, ImageInfo] = field(default_factory=dict)
    tagged: list[tuple[str, str]] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)

    def build(self, job: BuildJob, progress: Progress) -> str:
        self.jobs.append(job)
        progress(f"Step 1/1 : {job.dockerfile}\n")
        base = self.images.get(job.buildargs.get("BUILD_IMAGE", ""))
        layers = (*base.layers, "precompiled") if base else ("debian", "driver")
        info = ImageInfo(f"sha256:{len(self.jobs)}", 100 * len(layers), layers, ())
        for reference in job.references:
            self.images[reference] = info
        return info.id

    def tag(self, image: str, reference: str) -> None:
        self.tagged.append((image, reference))
        self.images[reference] = next(i for i in self.images.values() if i.id == image)

    def push(self, reference: str, progress: Progress) -> str:
        progress(f"{reference}: Pushed\n")
        self.pushed.append(reference)
        return "sha256:" + "0" * 64

    def inspect(self, reference: str) -> ImageInfo:
        return self.images[reference]

    def exists(self, reference: str) -> bool:
        return reference in self.images

    def version(self) -> str:
        return "27.3.1"

    def read_files(self, reference: str, directory: str) -> dict[str, bytes]:
        assert "precompiled" in self.images[reference].layers
        assert directory == "/opt/nvidia/precompiled"
        metadata = json.dumps({"kernel_release": self.kernel}).encode()
        return {"open/nvidia-modules-6.12.102/metadata.json": metadata}


@pytest.fixture
def docker(monkeypatch: pytest.MonkeyPatch) -> FakeDocker:
    fake = FakeDocker()
    monkeypatch.setattr(cli_tasks, "connect_docker", lambda _host, _multi: fake)
    return fake


@pytest.fixture
def c() -> MockContext:
    return MockContext(
        run={
            "git rev-parse HEAD": Result("0123abcd" * 5 + "\n"),
            "git remote get-url origin": Result("https://example.invalid/gdc.git\n"),
            "git log -1 --format=%cI": Result("2026-08-20T10:00:00+00:00\n"),
        }
    )


def test_tags_prints_what_a_build_would_get(c: MockContext, feed_url: str, capsys: Any) -> None:
    tasks.tags(c, releases_url=feed_url, registry="127.0.0.1:5000/gdc")
    assert capsys.readouterr().out.splitlines() == [
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar-flatcar4081.3.10",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar-flatcar4593.2.5",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar-flatcar4757.1.0",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar-flatcar4790.0.0",
        # One image per kernel: every live release of 6.12.102, and an alias for every OS tag
        # the Operator may ask with (the first GPU node's release, maybe the one its stream's
        # current release superseded).
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar4593.2.5",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar4757.1.0",
        f"127.0.0.1:5000/gdc/driver:{NEWEST}-flatcar4790.0.0",
        f"127.0.0.1:5000/gdc/driver:610-{KERNEL}-flatcar4081.3.10",
        f"127.0.0.1:5000/gdc/driver:610-{KERNEL}-flatcar4593.2.4",
        f"127.0.0.1:5000/gdc/driver:610-{KERNEL}-flatcar4593.2.5",
        f"127.0.0.1:5000/gdc/driver:610-{KERNEL}-flatcar4757.1.0",
        f"127.0.0.1:5000/gdc/driver:610-{KERNEL}-flatcar4790.0.0",
    ]


def test_tags_for_a_named_release_driver_and_prefix(
    c: MockContext, feed_url: str, capsys: Any
) -> None:
    tasks.tags(c, driver_version="580", flatcar_version="4757.1.0", prefix="flatcar-test-0123abcd",
               releases_url=feed_url)  # fmt: skip
    assert capsys.readouterr().out.split() == [
        "driver:flatcar-test-0123abcd-580.178.04-flatcar",
        "driver:flatcar-test-0123abcd-580.178.04-flatcar-flatcar4757.1.0",
        "driver:flatcar-test-0123abcd-580.178.04-flatcar4757.1.0",
        f"driver:flatcar-test-0123abcd-580-{KERNEL}-flatcar4757.1.0",
    ]


def test_build_of_the_build_image(
    c: MockContext, docker: FakeDocker, feed_url: str, capsys: Any
) -> None:
    tasks.build(c, variant="build", arch="amd64", releases_url=feed_url, driver_sha256=SUM,
                redist_sha256=REDIST, base_image=BASE)  # fmt: skip
    [job] = docker.jobs
    assert job.dockerfile == "images/build/Dockerfile"
    assert job.buildargs["DRIVER_VERSION"] == NEWEST
    assert job.buildargs["DRIVER_SHA256"] == f"amd64={SUM}"
    given = [item for item in REDIST.split(",") if ".amd64=" in item]
    assert job.buildargs["REDIST_SHA256"] == ",".join(sorted([*given, *RECORDED_AMD64]))
    assert job.buildargs["GIT_COMMIT"] == "0123abcd" * 5
    assert job.buildargs["FLATCAR_VERSIONS"] == "4081.3.10 4593.2.5 4757.1.0 4790.0.0"
    assert job.references[0] == f"driver:{NEWEST}-flatcar"
    assert docker.pushed == []
    out = capsys.readouterr().out
    assert "Step 1/1 : images/build/Dockerfile" in out
    assert "image 200 B in 2 layers" in out


def test_a_build_works_the_redist_digests_out_once(
    c: MockContext, docker: FakeDocker, feed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, invoke build read versions.toml's redist record and --redist-sha256 again for
    # its check, the build arguments and the recorded inputs: three times.
    read: list[str] = []
    redist_checksums = Driver.redist_checksums

    def counted(driver: Driver, arch: str) -> dict[str, str | None]:
        read.append(arch)
        return redist_checksums(driver, arch)

    monkeypatch.setattr(Driver, "redist_checksums", counted)
    tasks.build(c, variant="build", arch="amd64", releases_url=feed_url, driver_sha256=SUM,
                redist_sha256=REDIST)  # fmt: skip
    assert docker.jobs[0].buildargs["REDIST_SHA256"]
    assert read == ["amd64", "amd64"]  # the build argument, then what is left out


def test_build_and_push_of_a_precompiled_image(
    c: MockContext, docker: FakeDocker, feed_url: str, capsys: Any
) -> None:
    docker.kernel = "6.12.102+test"  # what the packages say wins over the feed
    # gzip: registry "r" is no registry to recompress in (test_compression_of_a_push does it).
    tasks.build(c, flatcar_version="4593.2.5", arch="amd64", registry="r", push=True,
                releases_url=feed_url, driver_sha256=SUM, redist_sha256=REDIST,
                compression="gzip")  # fmt: skip
    build_job, precompiled_job = docker.jobs
    assert precompiled_job.buildargs["BUILD_IMAGE"] == build_job.references[0]
    assert precompiled_job.buildargs["FLATCAR_VERSIONS"] == "4593.2.5"
    labels = build_job.labels
    assert labels["org.opencontainers.image.created"] == "2026-08-20T10:00:00+00:00"
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")
    assert precompiled_job.labels["org.opencontainers.image.base.name"] == build_job.references[0]
    assert precompiled_job.labels["org.opencontainers.image.base.digest"] == "sha256:1"
    assert docker.pushed == [
        f"r/driver:{NEWEST}-flatcar",
        f"r/driver:{NEWEST}-flatcar-flatcar4593.2.5",
        f"r/driver:{NEWEST}-flatcar4593.2.5",
        "r/driver:610-6.12.102-test-flatcar4593.2.5",
    ]
    assert "shares 2 of the build image's 2 layers and adds 1" in capsys.readouterr().out


def test_push_pushes_what_an_earlier_build_left(
    c: MockContext, docker: FakeDocker, feed_url: str, capsys: Any
) -> None:
    tasks.build(c, arch="amd64", releases_url=feed_url, driver_sha256=SUM, redist_sha256=REDIST)
    docker.pushed.clear()
    tasks.push_(c, releases_url=feed_url, compression="gzip")  # no registry: dockerd's default
    assert f"driver:610-{KERNEL}-flatcar4593.2.5" in docker.pushed
    assert f"pushed driver:{NEWEST}-flatcar@sha256:" in capsys.readouterr().out


def test_push_before_build_says_what_to_do(
    c: MockContext, docker: FakeDocker, feed_url: str
) -> None:
    with pytest.raises(Exit, match="is not in dockerd: run invoke build first"):
        tasks.push_(c, variant="build", releases_url=feed_url)


def test_build_without_checksum_options_takes_the_recorded_ones(
    c: MockContext, docker: FakeDocker, feed_url: str, capsys: Any
) -> None:
    """versions.toml records every driver's .run checksums: a plain build needs no option.

    Of the redist archives it records the fabric manager's and NSCQ's; NVLSM, IMEX and NVSDM
    are TODO (no public source lists them): the image is built without them, and says so.
    """
    recorded = load_versions().driver(NEWEST).sha256
    tasks.build(c, arch="amd64", releases_url=feed_url)
    build_job, precompiled_job = docker.jobs
    assert build_job.buildargs["DRIVER_SHA256"] == f"amd64={recorded['amd64']}"
    assert build_job.buildargs["REDIST_SHA256"] == ",".join(RECORDED_AMD64)
    assert (
        "versions.toml records no SHA-256 for imex.amd64, libnvsdm.amd64, nvlsm.amd64 of driver "
        f"{NEWEST}: the image is built without them" in capsys.readouterr().out
    )
    # The current stable release's per-kernel image (it carries every live release of its kernel).
    assert "4593.2.5" in precompiled_job.buildargs["FLATCAR_VERSIONS"].split()


def test_build_without_a_fabric_manager_digest_says_where_to_put_it(
    c: MockContext, docker: FakeDocker, feed_url: str
) -> None:
    """A driver versions.toml does not list: its .run digest given, its redist ones not."""
    with pytest.raises(Exit, match=r"no SHA-256 recorded for the fabricmanager archive of "
                       r"driver 535\.261\.03 on amd64: .*, or pass --redist-sha256 "
                       r"fabricmanager\.amd64=<sha256>"):  # fmt: skip
        tasks.build(c, variant="build", driver_version="535.261.03", arch="amd64",
                    releases_url=feed_url, driver_sha256=SUM)  # fmt: skip
    assert docker.jobs == []


def test_recorded_redist_checksums_become_the_build_argument(
    c: MockContext, docker: FakeDocker, feed_url: str
) -> None:
    given = [f"nvlsm.amd64={SUM}", f"imex.amd64={SUM}", f"libnvsdm.amd64={SUM}"]
    tasks.build(c, variant="build", arch="amd64", releases_url=feed_url, driver_sha256=SUM,
                redist_sha256=",".join(given))  # fmt: skip
    # versions.toml's record, completed by what is given.
    assert docker.jobs[0].buildargs["REDIST_SHA256"] == ",".join(sorted([*given, *RECORDED_AMD64]))


def test_an_unlisted_driver_builds_only_with_its_checksum(
    c: MockContext, docker: FakeDocker, feed_url: str
) -> None:
    fabric = f"fabricmanager.amd64={SUM},libnvidia_nscq.amd64={SUM}"
    tasks.build(c, variant="build", driver_version="535.261.03", arch="amd64",
                releases_url=feed_url, driver_sha256=SUM, redist_sha256=fabric)  # fmt: skip
    assert docker.jobs[0].buildargs["DRIVER_VERSION"] == "535.261.03"
    with pytest.raises(Exit, match=r"no SHA-256 recorded .*535\.261\.03\.run on amd64"):
        tasks.build(c, variant="build", driver_version="535.261.03", arch="amd64",
                    releases_url=feed_url, redist_sha256=fabric)  # fmt: skip


def test_a_multi_arch_build_must_push(c: MockContext, feed_url: str) -> None:
    with pytest.raises(Exit, match="add --push"):
        tasks.build(c, arch="all", releases_url=feed_url, driver_sha256=f"amd64={SUM}")


def test_a_multi_arch_build_goes_through_buildx(
    c: MockContext, feed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []
    fake = FakeDocker()

    def connect(host: str, multi_arch: bool) -> Buildx:
        assert multi_arch
        return Buildx(fake, lambda argv: commands.append(list(argv)) or 0, docker_host=host)

    monkeypatch.setattr(cli_tasks, "connect_docker", connect)
    tasks.build(c, variant="build", arch="amd64,arm64", push=True, registry="ghcr.io/me",
                releases_url=feed_url, driver_sha256=f"amd64={SUM},arm64={SUM}",
                redist_sha256=REDIST)  # fmt: skip
    [argv] = commands
    assert argv[:3] == ["docker", "buildx", "build"]
    assert "--push" in argv
    assert argv[argv.index("--allow") + 1] == "network.host"
    assert argv[argv.index("--platform") + 1] == "linux/amd64,linux/arm64"
    assert f"DRIVER_SHA256=amd64={SUM},arm64={SUM}" in argv
    assert not any(arg.startswith("TARGETARCH=") for arg in argv)
    assert argv[argv.index("--tag") + 1] == f"ghcr.io/me/driver:{NEWEST}-flatcar"
    assert fake.pushed == []  # buildx pushed it


def test_an_unreachable_feed_is_an_exit_with_advice(c: MockContext, tmp_path: Path) -> None:
    missing = (tmp_path / "none.json").as_uri()
    with pytest.raises(Exit, match=r"cannot read the Flatcar releases feed .* --releases-url"):
        tasks.tags(c, releases_url=missing)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"variant": "runtime"}, "unknown variant 'runtime'"),
        ({"arch": "riscv64"}, "unknown architecture"),
        ({"driver_version": "470"}, "driver 470 is not in versions.toml"),
        ({"flatcar_version": "1.2.3"}, "Flatcar 1.2.3 is not in the releases feed"),
        ({"prefix": "bad prefix"}, "invalid tag prefix"),
    ],
)
def test_bad_options_are_an_exit_with_advice(
    c: MockContext, feed_url: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exit, match=message):
        tasks.tags(c, releases_url=feed_url, **options)


def test_the_tasks_are_listed() -> None:
    assert set(tasks.ns.task_names) == {"build", "push", "tags", "matrix", "publish", "sign",
                                        "record-driver", "propose-drivers",
                                        "propose-peers"}  # fmt: skip


def test_every_task_parses_its_options_as_invoke_does() -> None:
    """invoke checks each help entry against the parameters only when it builds the parser."""
    for name in tasks.ns.task_names:
        assert tasks.ns[name].get_arguments(), name


def test_invoke_list_runs(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    root = Path(tasks.__file__).parent
    result = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(root), "--list"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "publish" in result.stdout


# --- the docker SDK adapter's stream handling (no dockerd) -------------------------------------


def test_a_build_stream_shows_progress_and_yields_the_image_id() -> None:
    lines: list[str] = []
    stream = [
        {"stream": "Step 1/2 : FROM base\n"},
        {"status": "Downloading", "id": "abc"},
        {"aux": {"ID": "sha256:feed"}},
        {"stream": "Successfully built feed\n"},
    ]
    assert docker_api._follow_build(stream, lines.append) == "sha256:feed"
    assert lines == ["Step 1/2 : FROM base\n", "abc: Downloading\n", "Successfully built feed\n"]


def test_a_failed_build_says_what_dockerd_said() -> None:
    stream = [{"stream": "Step 3/9 : RUN provision\n"}, {"error": "returned a non-zero code: 1"}]
    with pytest.raises(docker_api.DockerError, match=r"non-zero code: 1\nStep 3/9"):
        docker_api._follow_build(stream, lambda _line: None)


def test_a_push_stream_reports_each_layer_once_and_the_digest() -> None:
    lines: list[str] = []
    stream = [
        {"status": "Pushing", "id": "l1", "progressDetail": {"current": 1, "total": 2}},
        {"status": "Pushed", "id": "l1", "progressDetail": {}},
        {"status": "t: digest: sha256:abc size: 1"},
        {"aux": {"Tag": "t", "Digest": "sha256:abc", "Size": 1}},
    ]
    assert docker_api._follow_push(stream, "r:t", lines.append) == "sha256:abc"
    assert lines == ["l1: Pushed\n", "t: digest: sha256:abc size: 1\n"]
    with pytest.raises(docker_api.DockerError, match="docker push r:t failed: denied"):
        docker_api._follow_push([{"error": "denied"}], "r:t", lines.append)


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("127.0.0.1:5000/gdc/driver:580-flatcar", ("127.0.0.1:5000/gdc/driver", "580-flatcar")),
        ("127.0.0.1:5000/gdc/driver", ("127.0.0.1:5000/gdc/driver", "latest")),
        ("driver", ("driver", "latest")),
    ],
)
def test_split_reference(reference: str, expected: tuple[str, str]) -> None:
    assert docker_api.split_reference(reference) == expected


def test_files_of_a_docker_cp_archive() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in {
            "precompiled/open/p/metadata.json": b"{}",
            "precompiled/x": b"1",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        directory = tarfile.TarInfo("precompiled/open")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)  # skipped: only files are returned
    assert docker_api.files_in_tar(buffer.getvalue(), "precompiled") == {
        "open/p/metadata.json": b"{}",
        "x": b"1",
    }


def test_a_dockerd_that_goes_away_halfway_fails_the_build_in_one_line() -> None:
    def broken_stream() -> Iterator[dict[str, str]]:
        yield {"stream": "Step 7/11 : RUN nvidia-driver build\n"}
        raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes read)")

    with (
        pytest.raises(docker_api.DockerError) as caught,
        docker_api.dockerd_errors("docker build of r:t"),
    ):
        docker_api._follow_build(broken_stream(), lambda _line: None)
    message = str(caught.value)
    assert message.startswith("docker build of r:t failed: lost dockerd (Connection broken")
    assert "check that dockerd is running" in message
    assert "\n" not in message


def test_a_refusal_by_dockerd_is_one_line_with_its_explanation() -> None:
    refusal = APIError("500 Server Error", explanation="no space left on device")
    with (
        pytest.raises(docker_api.DockerError, match=r"^docker tag r:t failed: dockerd said no spa"),
        docker_api.dockerd_errors("docker tag r:t"),
    ):
        raise refusal
