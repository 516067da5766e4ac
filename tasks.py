"""Image tasks (``invoke --list``). Each task is a thin wrapper over the ``gdc`` tooling.

    invoke tags  [--variant precompiled] [--driver-version V] [--flatcar-version V] [--prefix P]
    invoke build [same] [--arch amd64|arm64|all] [--registry R] [--push]
                 [--compression zstd|gzip] [--zstd-level N]
    invoke push  [same] [--compression zstd|gzip] [--zstd-level N]
    invoke matrix  [--json | --github-output] [--registry R] [--prefix P]
    invoke publish --registry R [--arch A] [--step stage|merge|all] [--rebuild] [--dry-run]
                   [--retry-budget SECONDS] [--compression zstd|gzip] [--zstd-level N]
    invoke sign    --registry R [--key K] [--no-sbom] [--require-cosign] [--syft-sha256 HEX]
    invoke record-driver VERSION [--verify]   (versions.toml's entry, from NVIDIA's own files)
    invoke propose-drivers [--dry-run]        (a pull request per newer point release)
    invoke propose-peers [--dry-run]          (a pull request per newer release of a cluster peer)

Defaults: the newest driver in versions.toml, Flatcar's current stable release (from the
releases feed: $FLATCAR_RELEASES_URL or --releases-url for a mirror), this machine's arch.
matrix, publish and sign cover every image: see tooling/gdc/matrix.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import sys
import time
from pathlib import Path

# The tooling and the entrypoint package it reuses (the Flatcar feed parser) live in this
# repository, not in the environment that runs invoke.
_ROOT = Path(__file__).resolve().parent
for _path in (_ROOT / "tooling", _ROOT / "entrypoint" / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from invoke.collection import Collection  # noqa: E402
from invoke.context import Context  # noqa: E402
from invoke.exceptions import Exit  # noqa: E402
from invoke.tasks import task  # noqa: E402

from gdc import commands, images, matrix, plan, releases  # noqa: E402
from gdc import compression as compressing  # noqa: E402
from gdc import peers as peering  # noqa: E402
from gdc import propose as proposing  # noqa: E402
from gdc import publish as publishing  # noqa: E402
from gdc import record as recording  # noqa: E402
from gdc import sign as signing  # noqa: E402
from gdc import tags as tag_rules  # noqa: E402
from gdc.builder import BuildSettings, DockerBuilder  # noqa: E402
from gdc.docker_api import Buildx, Docker, DockerError, DockerSDK  # noqa: E402
from gdc.nvidia import NvidiaUpstream, RecordError  # noqa: E402
from gdc.registry import Registry, Repository, RetryBudget, credentials_for  # noqa: E402
from gdc.releases import ReleaseError  # noqa: E402
from gdc.tags import TagError, Variant, check_repository  # noqa: E402
from gdc.versions import VERSIONS_FILE, Versions, VersionsError, load_versions  # noqa: E402
from nvidia_driver.errors import DriverError  # noqa: E402
from nvidia_driver.formats.oci import token_hosts  # noqa: E402

FAILURES = (
    DriverError,  # the entrypoint's parsers the tooling reuses (a version, a kernel release)
    VersionsError,
    ReleaseError,
    TagError,
    DockerError,
    publishing.BuildError,
)

SELECTION_HELP = {
    "variant": "build (compiles on the node) or precompiled (one per Flatcar release)",
    "driver_version": "NVIDIA driver version or branch (default: newest in versions.toml)",
    "flatcar_version": "Flatcar release (default: current stable, from the releases feed)",
    "arch": "amd64, arm64, a comma list, or 'all' (multi-arch: buildx, needs --push)",
    "registry": "repository prefix, as the Operator's driver.repository (e.g. ghcr.io/me)",
    "image": "image name, as the Operator's driver.image (default: driver)",
    "prefix": "tag prefix for test builds, e.g. flatcar-test-<sha8>",
    "ci_prefix": "prefix from GitHub Actions: flatcar-test-<sha8> on a branch, none on a tag",
    "releases_url": "Flatcar releases.json URL (default: $FLATCAR_RELEASES_URL or flatcar.org)",
}
BUILD_HELP = {
    **SELECTION_HELP,
    "push": "push every tag after building",
    "base_image": "base image of the build image (default: the Dockerfile's pinned Debian)",
    "driver_sha256": "the .run's SHA-256 (HEX or amd64=HEX,arm64=HEX) instead of versions.toml",
    "redist_sha256": "the redist archives' SHA-256s (fabricmanager.amd64=HEX,...) instead of "
    "versions.toml",
    "driver_base_url": "where NVIDIA-Linux-*.run files are (default: NVIDIA's tesla downloads)",
    "fabricmanager_base_url": "NVIDIA's redist base (fabric manager, NSCQ, NVLSM, IMEX), a mirror",
    "release_base_url": "Flatcar release server template with {channel}, for mirrors and tests",
    "flatcar_keyring": "keyring that signs the mirror's Flatcar artifacts (default: Flatcar's)",
    "network": "network of build steps (default: host)",
    "docker_host": "dockerd to use (default: $DOCKER_HOST or the local socket)",
    "compression": "layers as pushed: zstd (default; recompressed in the registry after the push: "
    "containerd >= 1.5, CRI-O >= 1.21, Docker >= 23 pull it; a multi-arch buildx push stays "
    "gzip) or gzip (dockerd's, for older runtimes)",
    "zstd_level": f"zstd level, 1-22 (default {compressing.DEFAULT_LEVEL})",
}


MATRIX_HELP = {
    "json": "print one line of JSON for GitHub Actions (shape: tooling/gdc/matrix.py)",
    "github_output": "write that JSON as json=... to $GITHUB_OUTPUT (fails if it cannot)",
    "registry": SELECTION_HELP["registry"],
    "image": SELECTION_HELP["image"],
    "prefix": SELECTION_HELP["prefix"],
    "ci_prefix": SELECTION_HELP["ci_prefix"],
    "releases_url": SELECTION_HELP["releases_url"],
    "lts_info_url": "Flatcar's lts-info URL (default: $FLATCAR_LTS_INFO_URL or Flatcar's own)",
    "versions_file": "the versions file (default: versions.toml at the repository root)",
}
PUBLISH_HELP = {
    **{key: value for key, value in MATRIX_HELP.items() if key not in {"json", "github_output"}},
    "registry": "where to publish, e.g. ghcr.io/<owner> (required)",
    "arch": "the arches to build here (default: versions.toml's; CI: one per native runner)",
    "step": "stage (build and push each arch), merge (write the multi-arch tags) or all",
    "variant": "only build or only precompiled images (default: both)",
    "rebuild": "rebuild every image, whatever its recorded build inputs say",
    "dry_run": "print the plan and the summary; build, push and tag nothing; no dockerd needed",
    "retry_budget": "seconds the whole run may wait on a rate-limiting (429) or failing (5xx) "
    f"registry; past them each image that meets one fails (default "
    f"{publishing.RETRY_BUDGET_SECONDS:.0f})",
    **{key: BUILD_HELP[key] for key in ("base_image", "driver_base_url", "fabricmanager_base_url",
                                        "release_base_url", "flatcar_keyring", "network",
                                        "docker_host", "zstd_level")},
    "compression": "layers as published: zstd (default; each arch image recompressed in the "
    "registry after its push; needs Docker Engine >= 23, which pulls the zstd build images the "
    "precompiled ones start from) or gzip (dockerd 20.10, runtimes older than containerd 1.5)",
}  # fmt: skip
SIGN_HELP = {
    **{key: value for key, value in MATRIX_HELP.items() if key not in {"json", "github_output"}},
    "registry": "where the images are, e.g. ghcr.io/<owner> (required)",
    "ci_prefix": SELECTION_HELP["ci_prefix"],
    "key": "cosign key reference (default: keyless, with the CI job's OIDC token)",
    "sbom": "attest an SPDX SBOM made by syft (default); --no-sbom signs only",
    "require_cosign": "fail when cosign is not on PATH (default: say so, sign nothing)",
    "syft_sha256": "SHA-256 of the syft binary: any other syft is refused (the workflows pin it)",
}

RECORD_HELP = {
    "version": "the NVIDIA datacenter driver release, e.g. 580.178.04",
    "verify": "also download each .run (about 400 MB) and check it against its .sha256sum",
    "versions_file": MATRIX_HELP["versions_file"],
    "checksum_base_url": "where NVIDIA-Linux-*.run.sha256sum are (default: NVIDIA's XFree86 "
    "downloads)",
    "driver_base_url": BUILD_HELP["driver_base_url"],
    "fabricmanager_base_url": "NVIDIA's redist base with redistrib_<version>.json, a mirror",
}
PROPOSE_HELP = {
    **{key: value for key, value in RECORD_HELP.items() if key not in {"version", "verify"}},
    "dry_run": "print each proposal's change to versions.toml; no branch, no pull request",
    "releases_url": "NVIDIA's releases.json (default: docs.nvidia.com/datacenter/tesla/drivers/)",
}


def connect_docker(docker_host: str, multi_arch: bool) -> Docker:
    """The Docker adapter; unit tests replace this function with a fake."""
    sdk = DockerSDK(docker_host or None)
    return Buildx(sdk, docker_host=docker_host) if multi_arch else sdk


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


def _matrix(  # noqa: PLR0917 - the task options it needs
    versions: Versions, releases_url: str, lts_info_url: str, registry: str, image: str,
    prefix: str,
) -> matrix.Matrix:  # fmt: skip
    check_repository(registry, image)  # before the network is read
    feed = releases.load_feed(releases.feed_url(os.environ, releases_url))
    lts = releases.lts_info(os.environ, override=lts_info_url) if "lts" in versions.channels \
        else None  # fmt: skip
    return matrix.build_matrix(feed, versions, lts_info=lts, registry=registry, image=image,
                               prefix=prefix)  # fmt: skip


def _registry(registry: str, image: str) -> tuple[Repository, Registry]:
    repository = Repository.parse(check_repository(registry, image))
    return repository, _registry_for(repository.host)


def _registry_for(host: str) -> Registry:
    return Registry(host, credentials=credentials_for(host, os.environ),
                    token_hosts=token_hosts(os.environ))  # fmt: skip


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


@task(help=SELECTION_HELP, auto_shortflags=False)
def tags(  # noqa: PLR0917 - invoke maps each option to a parameter
    c: Context,
    variant: str = "precompiled",
    driver_version: str = "",
    flatcar_version: str = "",
    arch: str = "",
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
) -> None:
    """Print the tags a build would get, building nothing."""
    options = plan.Options(variant, driver_version, flatcar_version, arch, registry, image,
                           _prefix(prefix, ci_prefix), releases_url)  # fmt: skip
    try:
        request = _request(c, options)
        for planned in images.planned_tags(request):
            for reference in planned.references:
                print(reference)
    except FAILURES as exc:
        raise Exit(f"invoke tags: {exc}", code=1) from None


@task(help=BUILD_HELP, auto_shortflags=False)
def build(  # noqa: PLR0917 - invoke maps each option to a parameter
    c: Context,
    variant: str = "precompiled",
    driver_version: str = "",
    flatcar_version: str = "",
    arch: str = "",
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
    push: bool = False,
    base_image: str = "",
    driver_sha256: str = "",
    redist_sha256: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
    release_base_url: str = "",
    flatcar_keyring: str = "",
    network: str = "host",
    docker_host: str = "",
    compression: str = "zstd",
    zstd_level: int = compressing.DEFAULT_LEVEL,
) -> None:
    """Build a driver image (a precompiled build also builds its build image)."""
    upstream = plan.Upstream(base_image, driver_base_url, fabricmanager_base_url, release_base_url,
                             Path(flatcar_keyring) if flatcar_keyring else None)  # fmt: skip
    options = plan.Options(variant, driver_version, flatcar_version, arch, registry, image,
                           _prefix(prefix, ci_prefix), releases_url, driver_sha256, network,
                           upstream, redist_sha256)  # fmt: skip
    try:
        chosen = compressing.parse_compression(compression)
        compressing.check_level(zstd_level)
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
        docker = connect_docker(docker_host, request.multi_arch)
        built = images.build_images(request, docker, _print)
        images.report(built)
        if push:
            _recompress(images.push_images(built, docker, _print), chosen, zstd_level)
    except FAILURES as exc:
        raise Exit(f"invoke build: {exc}", code=1) from None


@task(
    name="push",
    help={
        **SELECTION_HELP,
        **{key: BUILD_HELP[key] for key in ("docker_host", "compression", "zstd_level")},
    },
    auto_shortflags=False,
)
def push_(  # noqa: PLR0917 - invoke maps each option to a parameter
    c: Context,
    variant: str = "precompiled",
    driver_version: str = "",
    flatcar_version: str = "",
    arch: str = "",
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
    docker_host: str = "",
    compression: str = "zstd",
    zstd_level: int = compressing.DEFAULT_LEVEL,
) -> None:
    """Push the tags of an earlier invoke build (same options) to the registry."""
    options = plan.Options(variant, driver_version, flatcar_version, arch, registry, image,
                           _prefix(prefix, ci_prefix), releases_url)  # fmt: skip
    try:
        chosen = compressing.parse_compression(compression)
        compressing.check_level(zstd_level)
        request = _request(c, options)
        docker = connect_docker(docker_host, False)  # noqa: FBT003 - the seam tests replace
        built = images.local_images(request, docker)
        images.report(built)
        pushed = _recompress(images.push_images(built, docker, _print), chosen, zstd_level)
        for reference, digest in pushed.items():
            print(f"pushed {reference}@{digest}")
    except FAILURES as exc:
        raise Exit(f"invoke push: {exc}", code=1) from None


@task(name="matrix", help=MATRIX_HELP, auto_shortflags=False)
def matrix_(  # noqa: PLR0917 - invoke maps each option to a parameter
    _c: Context,
    json: bool = False,
    github_output: bool = False,
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
    lts_info_url: str = "",
    versions_file: str = "",
) -> None:
    """List every image to publish: live Flatcar releases x drivers x arches."""
    output = os.environ.get("GITHUB_OUTPUT", "")
    if github_output and not output:
        raise Exit("invoke matrix: --github-output needs $GITHUB_OUTPUT (GitHub Actions sets "
                   "it); outside Actions use --json", code=1)  # fmt: skip
    try:
        covered = _matrix(_versions(versions_file), releases_url, lts_info_url, registry, image,
                          _prefix(prefix, ci_prefix))  # fmt: skip
    except FAILURES as exc:
        raise Exit(f"invoke matrix: {exc}", code=1) from None
    if github_output:
        with Path(output).open("a") as lines:
            lines.write(f"json={matrix.to_json(covered)}\n")
        print(matrix.to_table(covered), end="")
        return
    print(matrix.to_json(covered) if json else matrix.to_table(covered), end="\n" if json else "")


@task(help=PUBLISH_HELP, auto_shortflags=False)
def publish(  # noqa: PLR0917 - invoke maps each option to a parameter
    c: Context,
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
    lts_info_url: str = "",
    versions_file: str = "",
    arch: str = "",
    step: str = "all",
    variant: str = "",
    rebuild: bool = False,
    dry_run: bool = False,
    base_image: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
    release_base_url: str = "",
    flatcar_keyring: str = "",
    network: str = "host",
    docker_host: str = "",
    retry_budget: int = int(publishing.RETRY_BUDGET_SECONDS),
    compression: str = "zstd",
    zstd_level: int = compressing.DEFAULT_LEVEL,
) -> None:
    """Build and push what the registry lacks or what changed; merge the arches; summarize."""
    started = time.monotonic()
    chosen_step = publishing.Step(_choice(step, publishing.Step, "--step"))
    chosen_variant = Variant(_choice(variant, Variant, "--variant")) if variant else None
    upstream = plan.Upstream(base_image, driver_base_url, fabricmanager_base_url, release_base_url,
                             Path(flatcar_keyring) if flatcar_keyring else None)  # fmt: skip
    tag_prefix = _prefix(prefix, ci_prefix)
    settings = BuildSettings(registry, image, tag_prefix, upstream, network,
                             _git(c, "rev-parse HEAD"), _git(c, "remote get-url origin"),
                             _git(c, "log -1 --format=%cI", default=""))  # fmt: skip
    try:
        if not registry:
            raise TagError("--registry is required, e.g. ghcr.io/<your owner>")
        if retry_budget < 0:
            raise TagError(f"--retry-budget {retry_budget} is negative: give seconds, e.g. 120")
        chosen = compressing.parse_compression(compression)
        compressing.check_level(zstd_level)
        versions = _versions(versions_file)
        arches = plan.parse_arches(arch, versions) if arch else versions.arches
        repository, client = _registry(registry, image)  # arguments, before any network
        covered = _matrix(versions, releases_url, lts_info_url, registry, image, tag_prefix)
        client.budget = RetryBudget(retry_budget)
        client.check(repository.name)  # once, up front: unreachable or denied stops here

        @functools.cache
        def docker(multi: bool) -> Docker:  # one connection, the check's and the builds'
            return connect_docker(docker_host, multi)

        builds = not dry_run and chosen_step is not publishing.Step.MERGE
        if builds and chosen is compressing.Compression.ZSTD:  # before any build
            compressing.check_dockerd(docker(False).version())  # noqa: FBT003 - one arch
        with DockerBuilder(settings, covered, docker, _print, dry_run=dry_run) as builder:
            outcomes = publishing.publish(covered, client, repository, builder, arches=arches,
                                          step=chosen_step, variant=chosen_variant,
                                          dry_run=dry_run, rebuild=rebuild,
                                          retry_budget=retry_budget, compression=chosen,
                                          zstd_level=zstd_level)  # fmt: skip
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


@task(help=SIGN_HELP, auto_shortflags=False)
def sign(  # noqa: PLR0917 - invoke maps each option to a parameter
    _c: Context,
    registry: str = "",
    image: str = "driver",
    prefix: str = "",
    ci_prefix: bool = False,
    releases_url: str = "",
    lts_info_url: str = "",
    versions_file: str = "",
    key: str = "",
    sbom: bool = True,
    require_cosign: bool = False,
    syft_sha256: str = "",
) -> None:
    """Sign each published image of the matrix with cosign and attest its SBOM."""
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
        covered = _matrix(_versions(versions_file), releases_url, lts_info_url, registry,
                          image, _prefix(prefix, ci_prefix))  # fmt: skip
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


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


@task(help=RECORD_HELP, auto_shortflags=False)
def record_driver(  # noqa: PLR0917 - invoke maps each option to a parameter
    _c: Context,
    version: str,
    verify: bool = False,
    versions_file: str = "",
    checksum_base_url: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
) -> None:
    """Write versions.toml's entry for VERSION from NVIDIA's own checksums and redist manifest."""
    if version.startswith("-"):  # invoke hands a positional argument whatever comes first
        raise Exit("invoke record-driver: give the driver version first, e.g. invoke "
                   "record-driver 580.178.04 (its options: invoke --help record-driver)",
                   code=1)  # fmt: skip
    upstream = NvidiaUpstream(checksum_base_url, driver_base_url, fabricmanager_base_url)
    path = _versions_path(versions_file)
    try:
        record, replaced = recording.record_driver(version, path, upstream, verify=verify,
                                                   date=_today())  # fmt: skip
    except RecordError as exc:
        raise Exit(f"invoke record-driver: {exc}", code=1) from None
    print(f"invoke record-driver: {recording.summary_line(record, replaced, path)}")


@task(help=PROPOSE_HELP, auto_shortflags=False)
def propose_drivers(  # noqa: PLR0917 - invoke maps each option to a parameter
    _c: Context,
    dry_run: bool = False,
    releases_url: str = "",
    versions_file: str = "",
    checksum_base_url: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
) -> None:
    """Propose NVIDIA's newer point releases, and the TODOs its files now give, as pull requests."""
    upstream = NvidiaUpstream(
        checksum_base_url, driver_base_url, fabricmanager_base_url, releases_url
    )
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


@task(
    help={
        "dry_run": "print each change; lock, commit, push and open nothing",
        "peers_file": f"the peers file (default: {peering.PEERS_FILE} in this repository)",
    },
    auto_shortflags=False,
)
def propose_peers(_c: Context, dry_run: bool = False, peers_file: str = "") -> None:
    """Propose the cluster session's peers at their newest releases the Go module proxy serves,
    each as a pull request (see tooling/gdc/peers.py)."""
    path = Path(peers_file) if peers_file else _ROOT / peering.PEERS_FILE
    try:
        repository = None if dry_run else proposing.Repository.of(path, "propose-peers")
        proposer = peering.PeerProposer(path, lambda line: print(f"invoke propose-peers: {line}"),
                                        repository)  # fmt: skip
        proposals = proposer.propose()
    except (peering.PeerError, RecordError) as exc:
        raise Exit(f"invoke propose-peers: {exc}", code=1) from None
    opened = "dry run" if dry_run else _count(len(proposer.opened), "pull request") + " opened"
    print(f"invoke propose-peers: {_count(len(proposals), 'proposal')} ({opened})")


ns = Collection(tags, build, push_, matrix_, publish, sign, record_driver, propose_drivers,
                propose_peers)  # fmt: skip
