"""What each task of tasks.py does; tasks.py holds their signatures and docstrings.

Each function takes the task's options as invoke parses them ("" or LEVEL_NOT_GIVEN: not
given, so invoke's configuration or the built-in default applies; their help is
:mod:`gdc.task_options`'s), runs the tooling, and turns its failures into one line:
``invoke <task>: <why>`` and exit status 1.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
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
from gdc.builder import BuildSettings, DockerBuilder
from gdc.docker_api import Buildx, Docker, DockerError, DockerSDK
from gdc.nvidia import NvidiaUpstream, RecordError
from gdc.registry import Registry, Repository, RetryBudget, credentials_for
from gdc.releases import ReleaseError
from gdc.tags import TagError, Variant, check_repository
from gdc.task_options import CONFIG_SECTION, Configured
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


def _configured(c: Context, task: str, **options: str | int) -> Configured:
    """invoke's configuration, read once, with the options the task was given over it."""
    try:
        return Configured.of(c.config.get(CONFIG_SECTION)).given(**options)
    except TagError as exc:
        raise Exit(f"invoke {task}: {exc}", code=1) from None


def _git(c: Context, command: str, default: str = "unknown") -> str:
    result = c.run(f"git {command}", hide=True, warn=True)
    return result.stdout.strip() if result is not None and result.ok else default


def _request(c: Context, options: plan.Options) -> plan.Request:
    return plan.resolve(
        options,
        load_versions(),
        os.environ,
        git_commit=_git(c, "rev-parse HEAD"),
        source_url=_git(c, "remote get-url origin"),
        created=_git(c, "log -1 --format=%cI", default=""),
    )


def _prefix(prefix: str, from_ci: bool) -> str:
    try:
        return tag_rules.ci_prefix(os.environ) if from_ci else prefix
    except TagError as exc:
        raise Exit(f"invoke: {exc}", code=1) from None


def _print(text: str) -> None:
    print(text, end="", flush=True)


def _versions_path(versions_file: str) -> Path:
    return Path(versions_file) if versions_file else VERSIONS_FILE


def _versions(versions_file: str) -> Versions:
    return load_versions(_versions_path(versions_file))


def _matrix(versions: Versions, settings: Configured, registry: str, image: str, prefix: str) -> (
    matrix.Matrix
):  # fmt: skip
    check_repository(registry, image)  # before the network is read
    feed = releases.load_feed(releases.feed_url(os.environ, settings.releases_url))
    lts = releases.lts_info(os.environ, override=settings.lts_info_url) \
        if "lts" in versions.channels else None  # fmt: skip
    return matrix.build_matrix(feed, versions, lts_info=lts, registry=registry, image=image,
                               prefix=prefix)  # fmt: skip


def _registry(registry: str, image: str) -> tuple[Repository, Registry]:
    repository = Repository.parse(check_repository(registry, image))
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


def _selection(  # noqa: PLR0917 - the options every image task shares
    variant: str, driver_version: str, flatcar_version: str, arch: str, registry: str,
    image: str, prefix: str, ci_prefix: bool, settings: Configured, driver_sha256: str = "",
    redist_sha256: str = "",
) -> plan.Options:  # fmt: skip
    return plan.Options(variant, driver_version, flatcar_version, arch, registry, image,
                        _prefix(prefix, ci_prefix), settings.releases_url, driver_sha256,
                        settings.network, settings.upstream, redist_sha256)  # fmt: skip


def tags(
    c: Context, *, variant: str, driver_version: str, flatcar_version: str, arch: str,
    registry: str, image: str, prefix: str, ci_prefix: bool, releases_url: str,
) -> None:  # fmt: skip
    settings = _configured(c, "tags", releases_url=releases_url)
    options = _selection(variant, driver_version, flatcar_version, arch, registry, image, prefix,
                         ci_prefix, settings)  # fmt: skip
    try:
        request = _request(c, options)
        for planned in images.planned_tags(request):
            for reference in planned.references:
                print(reference)
    except FAILURES as exc:
        raise Exit(f"invoke tags: {exc}", code=1) from None


def build(
    c: Context, *, variant: str, driver_version: str, flatcar_version: str, arch: str,
    registry: str, image: str, prefix: str, ci_prefix: bool, releases_url: str, push: bool,
    base_image: str, driver_sha256: str, redist_sha256: str, driver_base_url: str,
    fabricmanager_base_url: str, release_base_url: str, flatcar_keyring: str, network: str,
    docker_host: str, compression: str, zstd_level: int,
) -> None:  # fmt: skip
    settings = _configured(c, "build", releases_url=releases_url, base_image=base_image,
                           driver_base_url=driver_base_url,
                           fabricmanager_base_url=fabricmanager_base_url,
                           release_base_url=release_base_url, flatcar_keyring=flatcar_keyring,
                           network=network, docker_host=docker_host, compression=compression,
                           zstd_level=zstd_level)  # fmt: skip
    options = _selection(variant, driver_version, flatcar_version, arch, registry, image, prefix,
                         ci_prefix, settings, driver_sha256, redist_sha256)  # fmt: skip
    try:
        chosen = _compression(settings)
        plan.check_options(options, push=push)
        request = _request(c, options)
        if request.multi_arch and not push:
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
        if push:
            _recompress(images.push_images(built, docker, _print), chosen, settings.zstd_level)
    except FAILURES as exc:
        raise Exit(f"invoke build: {exc}", code=1) from None


def push(
    c: Context, *, variant: str, driver_version: str, flatcar_version: str, arch: str,
    registry: str, image: str, prefix: str, ci_prefix: bool, releases_url: str,
    docker_host: str, compression: str, zstd_level: int,
) -> None:  # fmt: skip
    settings = _configured(c, "push", releases_url=releases_url, docker_host=docker_host,
                           compression=compression, zstd_level=zstd_level)  # fmt: skip
    options = _selection(variant, driver_version, flatcar_version, arch, registry, image, prefix,
                         ci_prefix, settings)  # fmt: skip
    try:
        chosen = _compression(settings)
        request = _request(c, options)
        docker = connect_docker(settings.docker_host, False)  # noqa: FBT003 - the tests' seam
        built = images.local_images(request, docker)
        images.report(built)
        pushed = _recompress(images.push_images(built, docker, _print), chosen,
                             settings.zstd_level)  # fmt: skip
        for reference, digest in pushed.items():
            print(f"pushed {reference}@{digest}")
    except FAILURES as exc:
        raise Exit(f"invoke push: {exc}", code=1) from None


def matrix_(
    c: Context, *, json: bool, github_output: bool, registry: str, image: str, prefix: str,
    ci_prefix: bool, releases_url: str, lts_info_url: str, versions_file: str,
) -> None:  # fmt: skip
    settings = _configured(c, "matrix", releases_url=releases_url, lts_info_url=lts_info_url)
    output = os.environ.get("GITHUB_OUTPUT", "")
    if github_output and not output:
        raise Exit("invoke matrix: --github-output needs $GITHUB_OUTPUT (GitHub Actions sets "
                   "it); outside Actions use --json", code=1)  # fmt: skip
    try:
        covered = _matrix(_versions(versions_file), settings, registry, image,
                          _prefix(prefix, ci_prefix))  # fmt: skip
    except FAILURES as exc:
        raise Exit(f"invoke matrix: {exc}", code=1) from None
    if github_output:
        with Path(output).open("a") as lines:
            lines.write(f"json={matrix.to_json(covered)}\n")
        print(matrix.to_table(covered), end="")
        return
    print(matrix.to_json(covered) if json else matrix.to_table(covered), end="\n" if json else "")


def publish(
    c: Context, *, registry: str, image: str, prefix: str, ci_prefix: bool, releases_url: str,
    lts_info_url: str, versions_file: str, arch: str, step: str, variant: str, rebuild: bool,
    dry_run: bool, base_image: str, driver_base_url: str, fabricmanager_base_url: str,
    release_base_url: str, flatcar_keyring: str, network: str, docker_host: str,
    retry_budget: int, compression: str, zstd_level: int,
) -> None:  # fmt: skip
    started = time.monotonic()
    settings = _configured(c, "publish", releases_url=releases_url, lts_info_url=lts_info_url,
                           base_image=base_image, driver_base_url=driver_base_url,
                           fabricmanager_base_url=fabricmanager_base_url,
                           release_base_url=release_base_url, flatcar_keyring=flatcar_keyring,
                           network=network, docker_host=docker_host, compression=compression,
                           zstd_level=zstd_level)  # fmt: skip
    chosen_step = publishing.Step(_choice(step, publishing.Step, "--step"))
    chosen_variant = Variant(_choice(variant, Variant, "--variant")) if variant else None
    tag_prefix = _prefix(prefix, ci_prefix)
    build_settings = BuildSettings(registry, image, tag_prefix, settings.upstream,
                                   settings.network, _git(c, "rev-parse HEAD"),
                                   _git(c, "remote get-url origin"),
                                   _git(c, "log -1 --format=%cI", default=""))  # fmt: skip
    try:
        if not registry:
            raise TagError("--registry is required, e.g. ghcr.io/<your owner>")
        if retry_budget < 0:
            raise TagError(f"--retry-budget {retry_budget} is negative: give seconds, e.g. 120")
        chosen = _compression(settings)
        versions = _versions(versions_file)
        arches = plan.parse_arches(arch, versions) if arch else versions.arches
        repository, client = _registry(registry, image)  # arguments, before any network
        covered = _matrix(versions, settings, registry, image, tag_prefix)
        client.budget = RetryBudget(retry_budget)
        client.check(repository.name)  # once, up front: unreachable or denied stops here

        @functools.cache
        def docker(multi: bool) -> Docker:  # one connection, the check's and the builds'
            return connect_docker(settings.docker_host, multi)

        builds = not dry_run and chosen_step is not publishing.Step.MERGE
        if builds and chosen is compressing.Compression.ZSTD:  # before any build
            compressing.check_dockerd(docker(False).version())  # noqa: FBT003 - one arch
        with DockerBuilder(build_settings, covered, docker, _print, dry_run=dry_run) as builder:
            outcomes = publishing.publish(covered, client, repository, builder, arches=arches,
                                          step=chosen_step, variant=chosen_variant,
                                          dry_run=dry_run, rebuild=rebuild,
                                          retry_budget=retry_budget, compression=chosen,
                                          zstd_level=settings.zstd_level)  # fmt: skip
    except FAILURES as exc:
        raise Exit(f"invoke publish: {exc}; nothing was built", code=1) from None
    print(publishing.summary(outcomes, covered.excluded, repository, covered.notes), end="")
    print(f"registry: {client.requests} requests ({client.retried} retried; "
          f"{client.budget.stated()}) in {time.monotonic() - started:.1f} s")  # fmt: skip
    failed = publishing.failures(outcomes)
    problems = []
    if failed:
        would = "would fail" if dry_run else "failed"
        problems.append(f"{len(failed)} of {len(outcomes)} images {would} (see the summary); fix "
                        "the cause and re-run: only what is missing is built")  # fmt: skip
    # A live release the feed's fault leaves without an image needs a person: the merge (or a
    # whole run) says so; a stage job leaves it to the merge.
    blocked = [x for x in covered.excluded if x.blocking]
    if blocked and chosen_step is not publishing.Step.STAGE:
        more = f" (and {len(blocked) - 1} more, see the summary)" if len(blocked) > 1 else ""
        problems.append(f"{blocked[0].reason}{more}")
    if problems:
        raise Exit(f"invoke publish: {'; '.join(problems)}", code=1)


def sign(
    c: Context, *, registry: str, image: str, prefix: str, ci_prefix: bool, releases_url: str,
    lts_info_url: str, versions_file: str, key: str, sbom: bool, require_cosign: bool,
    syft_sha256: str,
) -> None:  # fmt: skip
    settings = _configured(c, "sign", releases_url=releases_url, lts_info_url=lts_info_url)
    try:
        signing.check_sha256(syft_sha256)
    except signing.SignError as exc:
        raise Exit(f"invoke sign: {exc}", code=1) from None
    if not commands.available("cosign"):
        if require_cosign:
            raise Exit(f"invoke sign: {signing.NO_COSIGN}", code=1)
        print(f"invoke sign: {signing.NO_COSIGN}")
        return
    try:
        covered = _matrix(_versions(versions_file), settings, registry, image,
                          _prefix(prefix, ci_prefix))  # fmt: skip
        repository, client = _registry(registry, image)
        signer = signing.Signer(repository, key)
        results = signing.sign_images(covered, client, signer, sbom=sbom, syft_sha256=syft_sha256)
    except (*FAILURES, signing.SignError) as exc:
        raise Exit(f"invoke sign: {exc}; nothing was signed", code=1) from None
    print(signing.summary(results, repository), end="")
    failed = [result for result in results if result.status is signing.Status.FAILED]
    if failed:
        message = (f"invoke sign: {len(failed)} of {len(results)} images failed (see the "
                   "summary); re-run: what is signed already is skipped")  # fmt: skip
        raise Exit(message, code=1)


def _nvidia(c: Context, task: str, *, checksum_base_url: str, driver_base_url: str,
            fabricmanager_base_url: str, releases_url: str = "") -> NvidiaUpstream:  # fmt: skip
    """Where NVIDIA's files are read: the options, over invoke's configuration."""
    settings = _configured(c, task, checksum_base_url=checksum_base_url,
                           driver_base_url=driver_base_url,
                           fabricmanager_base_url=fabricmanager_base_url)  # fmt: skip
    return NvidiaUpstream(settings.checksum_base_url, settings.driver_base_url,
                          settings.fabricmanager_base_url, releases_url)  # fmt: skip


def record_driver(
    c: Context, version: str, *, verify: bool, versions_file: str, checksum_base_url: str,
    driver_base_url: str, fabricmanager_base_url: str,
) -> None:  # fmt: skip
    if version.startswith("-"):  # invoke hands a positional argument whatever comes first
        raise Exit("invoke record-driver: give the driver version first, e.g. invoke "
                   "record-driver 580.178.04 (its options: invoke --help record-driver)",
                   code=1)  # fmt: skip
    upstream = _nvidia(c, "record-driver", checksum_base_url=checksum_base_url,
                       driver_base_url=driver_base_url,
                       fabricmanager_base_url=fabricmanager_base_url)  # fmt: skip
    path = _versions_path(versions_file)
    try:
        record, replaced = recording.record_driver(version, path, upstream, verify=verify,
                                                   date=_today())  # fmt: skip
    except RecordError as exc:
        raise Exit(f"invoke record-driver: {exc}", code=1) from None
    print(f"invoke record-driver: {recording.summary_line(record, replaced, path)}")


def propose_drivers(
    c: Context, *, dry_run: bool, releases_url: str, versions_file: str, checksum_base_url: str,
    driver_base_url: str, fabricmanager_base_url: str,
) -> None:  # fmt: skip
    upstream = _nvidia(c, "propose-drivers", checksum_base_url=checksum_base_url,
                       driver_base_url=driver_base_url,
                       fabricmanager_base_url=fabricmanager_base_url,
                       releases_url=releases_url)  # fmt: skip
    path = _versions_path(versions_file)
    try:
        repository = None if dry_run else proposing.Repository.of(path)
        proposer = proposing.Proposer(path, upstream, os.environ, _today(),
                                      lambda line: print(f"invoke propose-drivers: {line}"),
                                      repository)  # fmt: skip
        proposals = proposer.run()
    except RecordError as exc:
        raise Exit(f"invoke propose-drivers: {exc}", code=1) from None
    opened = "dry run" if dry_run else _count(len(proposer.opened), "pull request") + " opened"
    print(f"invoke propose-drivers: {_count(len(proposals), 'proposal')} ({opened})")


def propose_peers(*, dry_run: bool, peers_file: str) -> None:
    path = Path(peers_file) if peers_file else context.ROOT / peering.PEERS_FILE
    try:
        repository = None if dry_run else proposing.Repository.of(path, "propose-peers")
        proposer = peering.PeerProposer(path, lambda line: print(f"invoke propose-peers: {line}"),
                                        repository)  # fmt: skip
        proposals = proposer.propose()
    except (peering.PeerError, RecordError) as exc:
        raise Exit(f"invoke propose-peers: {exc}", code=1) from None
    opened = "dry run" if dry_run else _count(len(proposer.opened), "pull request") + " opened"
    print(f"invoke propose-peers: {_count(len(proposals), 'proposal')} ({opened})")
