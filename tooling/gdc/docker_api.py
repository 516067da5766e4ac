"""The few Docker operations the tooling needs, behind one small interface.

:class:`DockerSDK` talks to dockerd through the docker SDK (classic builder, progress streamed).
:class:`Buildx` shells out to ``docker buildx build`` for multi-arch images, which only buildx
can make; it pushes as it builds. Unit tests use a fake with the same methods.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gdc.commands import Runner
from gdc.commands import run as _run
from gdc.text import first_line

if TYPE_CHECKING:
    import docker

Progress = Callable[[str], None]


class DockerError(RuntimeError):
    """A build or a push that dockerd refused; the message ends with what dockerd said."""


@dataclass(frozen=True)
class BuildJob:
    """One ``docker build``: context, Dockerfile (relative to it), arguments, references."""

    context: Path
    dockerfile: str
    buildargs: Mapping[str, str]
    references: tuple[str, ...]
    platforms: tuple[str, ...] = ()  # linux/<arch>; more than one needs buildx and a push
    network: str = "host"
    labels: Mapping[str, str] = field(default_factory=dict)


class HistoryEntry(NamedTuple):
    created_by: str
    size: int


@dataclass(frozen=True)
class ImageInfo:
    id: str
    size: int
    layers: tuple[str, ...]  # RootFS diff IDs, base first
    history: tuple[HistoryEntry, ...]  # base first; metadata steps have size 0
    repo_digest: str = ""  # sha256:... of the manifest it was pulled by or pushed as, if any

    @property
    def data_steps(self) -> tuple[HistoryEntry, ...]:
        """The build steps that wrote files (metadata steps such as ENV and LABEL write none)."""
        return tuple(entry for entry in self.history if entry.size > 0)


class Docker(Protocol):
    def build(self, job: BuildJob, progress: Progress) -> str:
        """Build and tag job; return the image ID (empty for a buildx push)."""
        ...

    def tag(self, image: str, reference: str) -> None: ...

    def push(self, reference: str, progress: Progress) -> str:
        """Push reference; return its manifest digest."""
        ...

    def inspect(self, reference: str) -> ImageInfo: ...

    def exists(self, reference: str) -> bool: ...

    def read_files(self, reference: str, directory: str) -> dict[str, bytes]:
        """Every regular file under directory in the image, keyed by path relative to it."""
        ...

    def version(self) -> str:
        """dockerd's own version (``docker version``'s Server.Version), e.g. 27.3.1."""
        ...


def split_reference(reference: str) -> tuple[str, str]:
    """``host:5000/a/driver:tag`` -> (``host:5000/a/driver``, ``tag``)."""
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:
        return reference, "latest"
    return repository, tag


class DockerSDK:
    """dockerd through the docker SDK; base_url None means $DOCKER_HOST or the default socket."""

    def __init__(self, base_url: str | None = None) -> None:
        import docker  # noqa: PLC0415 - only builds need it; `invoke --list` must not

        with dockerd_errors("connecting to dockerd"):
            self.client: docker.DockerClient = (
                docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
            )

    def build(self, job: BuildJob, progress: Progress) -> str:
        if len(job.platforms) > 1:
            raise DockerError("the classic builder makes one architecture: use Buildx")
        with dockerd_errors(f"docker build of {job.references[0]}"):
            return self._build(job, progress)

    def _build(self, job: BuildJob, progress: Progress) -> str:
        stream = self.client.api.build(
            path=str(job.context),
            dockerfile=job.dockerfile,
            buildargs=dict(job.buildargs),
            tag=job.references[0],
            network_mode=job.network,
            labels=dict(job.labels) or None,
            platform=job.platforms[0] if job.platforms else None,
            rm=True,
            forcerm=True,
            pull=False,  # no registry is reachable for bases: they come in as build args
            decode=True,
        )
        image_id = _follow_build(stream, progress)
        for reference in job.references[1:]:
            self.tag(image_id, reference)
        return image_id

    def tag(self, image: str, reference: str) -> None:
        repository, tag = split_reference(reference)
        with dockerd_errors(f"docker tag {reference}"):
            tagged = self.client.api.tag(image, repository, tag, force=True)
        if not tagged:
            raise DockerError(f"dockerd refused to tag {image} as {reference}")

    def push(self, reference: str, progress: Progress) -> str:
        repository, tag = split_reference(reference)
        with dockerd_errors(f"docker push {reference}"):
            stream = self.client.api.push(repository, tag=tag, stream=True, decode=True)
            return _follow_push(stream, reference, progress)

    def inspect(self, reference: str) -> ImageInfo:
        with dockerd_errors(f"docker inspect {reference}"):
            image = self.client.images.get(reference)
            raw_history = image.history()
        history = tuple(
            HistoryEntry(str(item.get("CreatedBy", "")), int(item.get("Size", 0)))
            for item in reversed(raw_history)
        )
        repo_digests = [str(d) for d in image.attrs.get("RepoDigests") or [] if "@" in str(d)]
        return ImageInfo(
            id=str(image.id),
            size=int(image.attrs.get("Size", 0)),
            layers=tuple(image.attrs.get("RootFS", {}).get("Layers", [])),
            history=history,
            repo_digest=repo_digests[0].rpartition("@")[2] if repo_digests else "",
        )

    def exists(self, reference: str) -> bool:
        import docker.errors  # noqa: PLC0415

        with dockerd_errors(f"docker inspect {reference}"):
            try:
                self.client.images.get(reference)
            except docker.errors.ImageNotFound:
                return False
        return True

    def version(self) -> str:
        with dockerd_errors("asking dockerd its version"):
            return str(self.client.version().get("Version", ""))

    def read_files(self, reference: str, directory: str) -> dict[str, bytes]:
        # A created, never started container: no process runs and no network is needed.
        with dockerd_errors(f"reading {directory} from {reference}"):
            container = self.client.containers.create(
                reference, command=["true"], entrypoint=[], network_mode="none"
            )
            try:
                chunks, _ = container.get_archive(directory)
                return files_in_tar(b"".join(chunks), PurePosixPath(directory).name)
            finally:
                container.remove(force=True)


@contextmanager
def dockerd_errors(action: str) -> Iterator[None]:
    """dockerd's refusals and a dropped connection as one DockerError line.

    A dockerd that stops halfway through a build must fail that image, not the whole run.
    """
    import docker.errors  # noqa: PLC0415
    import requests.exceptions  # noqa: PLC0415
    import urllib3.exceptions  # noqa: PLC0415

    try:
        yield
    except docker.errors.APIError as exc:
        reason = str(exc.explanation or exc).strip().splitlines()[0]
        raise DockerError(f"{action} failed: dockerd said {reason}") from exc
    except (
        docker.errors.DockerException,
        requests.exceptions.RequestException,
        urllib3.exceptions.HTTPError,
        ConnectionError,
    ) as exc:
        raise DockerError(
            f"{action} failed: lost dockerd ({first_line(exc)}); check that dockerd is running at "
            "--docker-host / $DOCKER_HOST, then re-run"
        ) from exc


def files_in_tar(data: bytes, top: str) -> dict[str, bytes]:
    """Regular files of a ``docker cp`` tar, keyed by path below its top directory."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if not member.isfile():
                continue
            path = PurePosixPath(member.name)
            relative = PurePosixPath(*path.parts[1:]) if path.parts[:1] == (top,) else path
            extracted = tar.extractfile(member)
            if extracted is not None:
                files[str(relative)] = extracted.read()
    return files


def _follow_build(stream: Iterable[Mapping[str, Any]], progress: Progress) -> str:
    image_id = ""
    tail: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            detail = "".join(tail[-20:])
            raise DockerError(f"docker build failed: {chunk['error']}\n{detail}")
        text = str(chunk.get("stream", "") or _status_line(chunk))
        if text:
            progress(text)
            tail.append(text)
        aux = chunk.get("aux")
        if isinstance(aux, Mapping) and "ID" in aux:
            image_id = str(aux["ID"])
    if not image_id:
        raise DockerError("docker build ended without an image ID:\n" + "".join(tail[-20:]))
    return image_id


def _follow_push(stream: Iterable[Mapping[str, Any]], reference: str, progress: Progress) -> str:
    digest = ""
    for chunk in stream:
        if "error" in chunk:
            raise DockerError(f"docker push {reference} failed: {chunk['error']}")
        # Per-layer byte counts are noise in a log: report each layer's outcome once.
        if "progressDetail" in chunk and chunk.get("progressDetail"):
            continue
        line = _status_line(chunk)
        if line:
            progress(line)
        aux = chunk.get("aux")
        if isinstance(aux, Mapping) and "Digest" in aux:
            digest = str(aux["Digest"])
    return digest


def _status_line(chunk: Mapping[str, Any]) -> str:
    status = chunk.get("status")
    if not status:
        return ""
    layer = chunk.get("id")
    return f"{layer}: {status}\n" if layer else f"{status}\n"


class Buildx:
    """Multi-arch builds with ``docker buildx build --push`` (needs a buildx builder and QEMU).

    Everything but build is the SDK client's it wraps, so sizes and pushes of single-arch
    images still work through it.
    """

    def __init__(self, sdk: Docker, runner: Runner = _run, docker_host: str = "") -> None:
        self.sdk = sdk
        self.runner = runner
        self.docker_host = docker_host
        self.tag = sdk.tag
        self.push = sdk.push
        self.inspect = sdk.inspect
        self.exists = sdk.exists
        self.read_files = sdk.read_files
        self.version = sdk.version

    def build_argv(self, job: BuildJob) -> list[str]:
        argv = ["docker"]
        if self.docker_host:
            argv += ["--host", self.docker_host]
        argv += ["buildx", "build", "--push", "--network", job.network]
        if job.network == "host":  # an entitlement under buildx's docker-container driver
            argv += ["--allow", "network.host"]
        argv += ["--platform", ",".join(job.platforms), "--file", str(job.context / job.dockerfile)]
        for key, value in sorted(job.buildargs.items()):
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(job.labels.items()):
            argv += ["--label", f"{key}={value}"]
        for reference in job.references:
            argv += ["--tag", reference]
        return [*argv, str(job.context)]

    def build(self, job: BuildJob, progress: Progress) -> str:
        argv = self.build_argv(job)
        progress(" ".join(argv) + "\n")
        code = self.runner(argv)
        if code != 0:
            raise DockerError(f"docker buildx build exited {code}; see its output above")
        return ""
