"""What each task of tasks.py does; tasks.py holds their signatures and docstrings.

Each function takes the task's options as invoke parses them (:class:`gdc.task_options.Given`:
"" or LEVEL_NOT_GIVEN is not given, so invoke's configuration or the built-in default applies),
runs the tooling, and turns its failures into one line: ``invoke <task>: <why>`` and exit
status 1.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from invoke.context import Context
from invoke.exceptions import Exit

from gdc import commands, context, images, matrix, plan, releases
from gdc import compression as compressing
from gdc import peers as peering
from gdc import propose as proposing
from gdc import publish as publishing
from gdc import record as recording
from gdc import sign as signing
from gdc import tags as tag_rules
from gdc.builder import DockerBuilder
from gdc.docker_api import Buildx, Docker, DockerError, DockerSDK
from gdc.nvidia import NvidiaUpstream, RecordError
from gdc.registry import Registry, Repository, RetryBudget, credentials_for
from gdc.releases import ReleaseError
from gdc.tags import TagError, Variant, check_repository
from gdc.task_options import CONFIG_SECTION, Configured, Given
from gdc.versions import VERSIONS_FILE, Versions, VersionsError, load_versions
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import token_hosts

FAILURES = (
    DriverError,  # the entrypoint's parsers the tooling reuses (a version, a kernel release)
    VersionsError,
    ReleaseError,
    TagError,
    DockerError,
    publishing.BuildError,
)


def connect_docker(docker_host: str, multi_arch: bool) -> Docker:
    """The Docker adapter; unit tests replace this function with a fake."""
    sdk = DockerSDK(docker_host or None)
    return Buildx(sdk, docker_host=docker_host) if multi_arch else sdk


@contextmanager
def _failing(task: str, *more: type[Exception], then: str = "") -> Iterator[None]:
    """The tooling's failures as one line and exit status 1: ``invoke <task>: <why><then>``."""
    caught: tuple[type[Exception], ...] = (*FAILURES, *more)
    try:
        yield
    except caught as exc:
        raise Exit(f"invoke {task}: {exc}{then}", code=1) from None


def _configured(c: Context, task: str, given: Given) -> Configured:
    """invoke's configuration, read once, with the options the task was given over it."""
    try:
        return Configured.of(c.config.get(CONFIG_SECTION)).over(given)
    except TagError as exc:
        raise Exit(f"invoke {task}: {exc}", code=1) from None


def _git(c: Context, command: str, default: str = "unknown") -> str:
    result = c.run(f"git {command}", hide=True, warn=True)
    return result.stdout.strip() if result is not None and result.ok else default


def _provenance(c: Context) -> tuple[str, str, str]:
    """The commit, the repository's URL and the commit's time, for the images' labels."""
    return (_git(c, "rev-parse HEAD"), _git(c, "remote get-url origin"),
            _git(c, "log -1 --format=%cI", default=""))  # fmt: skip


def _build_settings(c: Context, given: Given, settings: Configured) -> plan.BuildSettings:
    return plan.BuildSettings(given.registry, given.image, _prefix(given), settings.upstream,
                              settings.network, *_provenance(c))  # fmt: skip


def _options(c: Context, given: Given, settings: Configured) -> plan.Options:
    """What tags, build and push are about, as given."""
    return plan.Options(given.variant, given.driver_version, given.flatcar_version, given.arch,
                        _build_settings(c, given, settings), settings.releases_url,
                        given.driver_sha256, given.redist_sha256)  # fmt: skip


def _request(options: plan.Options) -> plan.Request:
    return plan.resolve(options, load_versions(), os.environ)


def _prefix(given: Given) -> str:
    try:
        return tag_rules.ci_prefix(os.environ) if given.ci_prefix else given.prefix
    except TagError as exc:
        raise Exit(f"invoke: {exc}", code=1) from None


def _print(text: str) -> None:
    print(text, end="", flush=True)


def _versions_path(given: Given) -> Path:
    return Path(given.versions_file) if given.versions_file else VERSIONS_FILE


def _matrix(versions: Versions, settings: Configured, given: Given, prefix: str) -> matrix.Matrix:
    check_repository(given.registry, given.image)  # before the network is read
    feed = releases.load_feed(releases.feed_url(os.environ, settings.releases_url))
    lts = releases.lts_info(os.environ, override=settings.lts_info_url) \
        if "lts" in versions.channels else None  # fmt: skip
    return matrix.build_matrix(feed, versions, lts_info=lts, registry=given.registry,
                               image=given.image, prefix=prefix)  # fmt: skip


def _registry(given: Given) -> tuple[Repository, Registry]:
    repository = Repository.parse(check_repository(given.registry, given.image))
    return repository, _registry_for(repository.host)


def _registry_for(host: str) -> Registry:
    return Registry(host, credentials=credentials_for(host, os.environ),
                    token_hosts=token_hosts(os.environ))  # fmt: skip


def _compression(settings: Configured) -> compressing.Compression:
    chosen = compressing.parse_compression(settings.compression)
    compressing.check_level(settings.zstd_level)
    return chosen


def _recompress(pushed: dict[str, str], chosen: compressing.Compression, level: int) -> dict[
    str, str
]:  # fmt: skip
    """With zstd, each pushed reference recompressed in its registry; reference -> digest."""
    if chosen is compressing.Compression.GZIP:
        return pushed
    return compressing.recompress_references(pushed, level, _registry_for, _print)


def _choice(text: str, kind: type[publishing.Step | Variant], what: str) -> (
    publishing.Step | Variant
):  # fmt: skip
    try:
        return kind(text)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise Exit(f"invoke publish: unknown {what} {text!r}: use {known}", code=1) from None


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def tags(c: Context, given: Given) -> None:
    options = _options(c, given, _configured(c, "tags", given))
    with _failing("tags"):
        for planned in images.planned_tags(_request(options)):
            for reference in planned.references:
                print(reference)


def build(c: Context, given: Given) -> None:
    settings = _configured(c, "build", given)
    options = _options(c, given, settings)
    with _failing("build"):
        chosen = _compression(settings)
        plan.check_options(options, push=given.push)
        request = _request(options)
        if request.multi_arch and not given.push:
            raise Exit("invoke build: a multi-arch build is pushed as it is built: add --push")
        request.redist_spec  # noqa: B018 - refuses a missing fabric manager or NSCQ digest here
        if skipped := request.unrecorded_redist():
            _print(f"invoke build: versions.toml records no SHA-256 for {', '.join(skipped)} "
                   f"of driver {request.driver.version}: the image is built without them "
                   f"(B200/GB200 need NVLSM: `invoke record-driver {request.driver.version}` "
                   "records them from NVIDIA's files, or pass --redist-sha256)\n")  # fmt: skip
        docker = connect_docker(settings.docker_host, request.multi_arch)
        built = images.build_images(request, docker, _print)
        images.report(built)
        if given.push:
            _recompress(images.push_images(built, docker, _print), chosen, settings.zstd_level)


def push(c: Context, given: Given) -> None:
    settings = _configured(c, "push", given)
    options = _options(c, given, settings)
    with _failing("push"):
        chosen = _compression(settings)
        request = _request(options)
        docker = connect_docker(settings.docker_host, False)  # noqa: FBT003 - the tests' seam
        built = images.local_images(request, docker)
        images.report(built)
        pushed = _recompress(images.push_images(built, docker, _print), chosen,
                             settings.zstd_level)  # fmt: skip
        for reference, digest in pushed.items():
            print(f"pushed {reference}@{digest}")


def matrix_(c: Context, given: Given) -> None:
    settings = _configured(c, "matrix", given)
    output = os.environ.get("GITHUB_OUTPUT", "")
    if given.github_output and not output:
        raise Exit("invoke matrix: --github-output needs $GITHUB_OUTPUT (GitHub Actions sets "
                   "it); outside Actions use --json", code=1)  # fmt: skip
    with _failing("matrix"):
        covered = _matrix(load_versions(_versions_path(given)), settings, given, _prefix(given))
    if given.github_output:
        with Path(output).open("a") as lines:
            lines.write(f"json={matrix.to_json(covered)}\n")
    json = given.json and not given.github_output
    print(matrix.to_json(covered) if json else matrix.to_table(covered), end="\n" if json else "")


def publish(c: Context, given: Given) -> None:
    started = time.monotonic()
    settings = _configured(c, "publish", given)
    step = publishing.Step(_choice(given.step, publishing.Step, "--step"))
    variant = Variant(_choice(given.variant, Variant, "--variant")) if given.variant else None
    build_settings = _build_settings(c, given, settings)
    with _failing("publish", then="; nothing was built"):
        if not given.registry:
            raise TagError("--registry is required, e.g. ghcr.io/<your owner>")
        if given.retry_budget < 0:
            raise TagError(f"--retry-budget {given.retry_budget} is negative: give seconds, e.g. "
                           "120")  # fmt: skip
        chosen = _compression(settings)
        versions = load_versions(_versions_path(given))
        arches = plan.parse_arches(given.arch, versions) if given.arch else versions.arches
        repository, client = _registry(given)  # arguments, before any network
        covered = _matrix(versions, settings, given, build_settings.prefix)
        client.budget = RetryBudget(given.retry_budget)
        client.check(repository.name)  # once, up front: unreachable or denied stops here

        @functools.cache
        def docker(multi: bool) -> Docker:  # one connection, the check's and the builds'
            return connect_docker(settings.docker_host, multi)

        builds = not given.dry_run and step is not publishing.Step.MERGE
        if builds and chosen is compressing.Compression.ZSTD:  # before any build
            compressing.check_dockerd(docker(False).version())  # noqa: FBT003 - one arch
        with tempfile.TemporaryDirectory(prefix="gdc-publish.") as scratch:
            builder = DockerBuilder(build_settings, covered, docker, _print, Path(scratch),
                                    dry_run=given.dry_run)  # fmt: skip
            outcomes = publishing.publish(covered, client, repository, builder, arches=arches,
                                          step=step, variant=variant, dry_run=given.dry_run,
                                          rebuild=given.rebuild, retry_budget=given.retry_budget,
                                          compression=chosen,
                                          zstd_level=settings.zstd_level)  # fmt: skip
    print(publishing.summary(outcomes, covered.excluded, repository, covered.notes), end="")
    print(f"registry: {client.requests} requests ({client.retried} retried; "
          f"{client.budget.stated()}) in {time.monotonic() - started:.1f} s")  # fmt: skip
    failed = publishing.failures(outcomes)
    problems = []
    if failed:
        would = "would fail" if given.dry_run else "failed"
        problems.append(f"{len(failed)} of {len(outcomes)} images {would} (see the summary); fix "
                        "the cause and re-run: only what is missing is built")  # fmt: skip
    # A live release the feed's fault leaves without an image needs a person: the merge (or a
    # whole run) says so; a stage job leaves it to the merge.
    blocked = [x for x in covered.excluded if x.blocking]
    if blocked and step is not publishing.Step.STAGE:
        more = f" (and {len(blocked) - 1} more, see the summary)" if len(blocked) > 1 else ""
        problems.append(f"{blocked[0].reason}{more}")
    if problems:
        raise Exit(f"invoke publish: {'; '.join(problems)}", code=1)


def sign(c: Context, given: Given) -> None:
    settings = _configured(c, "sign", given)
    with _failing("sign", signing.SignError):
        signing.check_sha256(given.syft_sha256)
    if not commands.available("cosign"):
        if given.require_cosign:
            raise Exit(f"invoke sign: {signing.NO_COSIGN}", code=1)
        print(f"invoke sign: {signing.NO_COSIGN}")
        return
    with _failing("sign", signing.SignError, then="; nothing was signed"):
        covered = _matrix(load_versions(_versions_path(given)), settings, given, _prefix(given))
        repository, client = _registry(given)
        signer = signing.Signer(repository, given.key)
        results = signing.sign_images(covered, client, signer, sbom=given.sbom,
                                      syft_sha256=given.syft_sha256)  # fmt: skip
    print(signing.summary(results, repository), end="")
    failed = [result for result in results if result.status is signing.Status.FAILED]
    if failed:
        message = (f"invoke sign: {len(failed)} of {len(results)} images failed (see the "
                   "summary); re-run: what is signed already is skipped")  # fmt: skip
        raise Exit(message, code=1)


def _nvidia(c: Context, task: str, given: Given) -> NvidiaUpstream:
    """Where NVIDIA's files are read: the options, over invoke's configuration. propose-drivers'
    --releases-url is NVIDIA's list of releases, so it stays out of the configuration's Flatcar
    feed."""
    settings = _configured(c, task, replace(given, releases_url=""))
    return NvidiaUpstream(settings.checksum_base_url, settings.driver_base_url,
                          settings.fabricmanager_base_url, given.releases_url)  # fmt: skip


def record_driver(c: Context, given: Given) -> None:
    if given.version.startswith("-"):  # invoke hands a positional argument whatever comes first
        raise Exit("invoke record-driver: give the driver version first, e.g. invoke "
                   "record-driver 580.178.04 (its options: invoke --help record-driver)",
                   code=1)  # fmt: skip
    upstream = _nvidia(c, "record-driver", given)
    path = _versions_path(given)
    with _failing("record-driver", RecordError):
        record, replaced = recording.record_driver(given.version, path, upstream,
                                                   verify=given.verify, date=_today())  # fmt: skip
    print(f"invoke record-driver: {recording.summary_line(record, replaced, path)}")


def _opened(task: str, given: Given, proposals: int, opened: int) -> None:
    """A proposing task's last line: what it proposed and opened."""
    done = "dry run" if given.dry_run else _count(opened, "pull request") + " opened"
    print(f"invoke {task}: {_count(proposals, 'proposal')} ({done})")


def propose_drivers(c: Context, given: Given) -> None:
    upstream = _nvidia(c, "propose-drivers", given)
    path = _versions_path(given)
    with _failing("propose-drivers", RecordError):
        repository = None if given.dry_run else proposing.Repository.of(path)
        proposer = proposing.Proposer(path, upstream, os.environ, _today(),
                                      lambda line: print(f"invoke propose-drivers: {line}"),
                                      repository)  # fmt: skip
        proposals = proposer.run()
    _opened("propose-drivers", given, len(proposals), len(proposer.opened))


def propose_peers(given: Given) -> None:
    path = Path(given.peers_file) if given.peers_file else context.ROOT / peering.PEERS_FILE
    with _failing("propose-peers", peering.PeerError, RecordError):
        repository = None if given.dry_run else proposing.Repository.of(path, "propose-peers")
        proposer = peering.PeerProposer(path, lambda line: print(f"invoke propose-peers: {line}"),
                                        repository)  # fmt: skip
        proposals = proposer.propose()
    _opened("propose-peers", given, len(proposals), len(proposer.opened))
