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
Mirror and build settings may come from invoke's configuration instead of options: section
``images`` (gdc/task_options.py; docs/building.md). matrix, publish and sign cover every
image: see tooling/gdc/matrix.py. What each task does is in tooling/gdc/cli_tasks.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The tooling and the entrypoint package it reuses (the Flatcar feed parser) live in this
# repository, not in the environment that runs invoke.
_ROOT = Path(__file__).resolve().parent
for _path in (_ROOT / "tooling", _ROOT / "entrypoint" / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from invoke.collection import Collection  # noqa: E402
from invoke.context import Context  # noqa: E402
from invoke.tasks import task  # noqa: E402

from gdc import cli_tasks, task_options  # noqa: E402

# invoke maps each option to a parameter (PLR0917); "" or 0: not given, the configured default.


@task(help=task_options.TAGS_HELP, auto_shortflags=False)
def tags(  # noqa: PLR0917
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
    cli_tasks.tags(c, variant=variant, driver_version=driver_version,
                   flatcar_version=flatcar_version, arch=arch, registry=registry, image=image,
                   prefix=prefix, ci_prefix=ci_prefix, releases_url=releases_url)  # fmt: skip


@task(help=task_options.BUILD_HELP, auto_shortflags=False)
def build(  # noqa: PLR0917
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
    network: str = "",
    docker_host: str = "",
    compression: str = "",
    zstd_level: int = task_options.LEVEL_NOT_GIVEN,
) -> None:
    """Build a driver image (a precompiled build also builds its build image)."""
    cli_tasks.build(c, variant=variant, driver_version=driver_version,
                    flatcar_version=flatcar_version, arch=arch, registry=registry, image=image,
                    prefix=prefix, ci_prefix=ci_prefix, releases_url=releases_url, push=push,
                    base_image=base_image, driver_sha256=driver_sha256,
                    redist_sha256=redist_sha256, driver_base_url=driver_base_url,
                    fabricmanager_base_url=fabricmanager_base_url,
                    release_base_url=release_base_url, flatcar_keyring=flatcar_keyring,
                    network=network, docker_host=docker_host, compression=compression,
                    zstd_level=zstd_level)  # fmt: skip


@task(name="push", help=task_options.PUSH_HELP, auto_shortflags=False)
def push_(  # noqa: PLR0917
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
    compression: str = "",
    zstd_level: int = task_options.LEVEL_NOT_GIVEN,
) -> None:
    """Push the tags of an earlier invoke build (same options) to the registry."""
    cli_tasks.push(c, variant=variant, driver_version=driver_version,
                   flatcar_version=flatcar_version, arch=arch, registry=registry, image=image,
                   prefix=prefix, ci_prefix=ci_prefix, releases_url=releases_url,
                   docker_host=docker_host, compression=compression,
                   zstd_level=zstd_level)  # fmt: skip


@task(name="matrix", help=task_options.MATRIX_HELP, auto_shortflags=False)
def matrix_(  # noqa: PLR0917
    c: Context,
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
    cli_tasks.matrix_(c, json=json, github_output=github_output, registry=registry, image=image,
                      prefix=prefix, ci_prefix=ci_prefix, releases_url=releases_url,
                      lts_info_url=lts_info_url, versions_file=versions_file)  # fmt: skip


@task(help=task_options.PUBLISH_HELP, auto_shortflags=False)
def publish(  # noqa: PLR0917
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
    network: str = "",
    docker_host: str = "",
    retry_budget: int = task_options.RETRY_BUDGET_SECONDS,
    compression: str = "",
    zstd_level: int = task_options.LEVEL_NOT_GIVEN,
) -> None:
    """Build and push what the registry lacks or what changed; merge the arches; summarize."""
    cli_tasks.publish(c, registry=registry, image=image, prefix=prefix, ci_prefix=ci_prefix,
                      releases_url=releases_url, lts_info_url=lts_info_url,
                      versions_file=versions_file, arch=arch, step=step, variant=variant,
                      rebuild=rebuild, dry_run=dry_run, base_image=base_image,
                      driver_base_url=driver_base_url,
                      fabricmanager_base_url=fabricmanager_base_url,
                      release_base_url=release_base_url, flatcar_keyring=flatcar_keyring,
                      network=network, docker_host=docker_host, retry_budget=retry_budget,
                      compression=compression, zstd_level=zstd_level)  # fmt: skip


@task(help=task_options.SIGN_HELP, auto_shortflags=False)
def sign(  # noqa: PLR0917
    c: Context,
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
    cli_tasks.sign(c, registry=registry, image=image, prefix=prefix, ci_prefix=ci_prefix,
                   releases_url=releases_url, lts_info_url=lts_info_url,
                   versions_file=versions_file, key=key, sbom=sbom,
                   require_cosign=require_cosign, syft_sha256=syft_sha256)  # fmt: skip


@task(help=task_options.RECORD_HELP, auto_shortflags=False)
def record_driver(  # noqa: PLR0917
    c: Context,
    version: str,
    verify: bool = False,
    versions_file: str = "",
    checksum_base_url: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
) -> None:
    """Write versions.toml's entry for VERSION from NVIDIA's own checksums and redist manifest."""
    cli_tasks.record_driver(c, version, verify=verify, versions_file=versions_file,
                            checksum_base_url=checksum_base_url, driver_base_url=driver_base_url,
                            fabricmanager_base_url=fabricmanager_base_url)  # fmt: skip


@task(help=task_options.PROPOSE_HELP, auto_shortflags=False)
def propose_drivers(  # noqa: PLR0917
    c: Context,
    dry_run: bool = False,
    releases_url: str = "",
    versions_file: str = "",
    checksum_base_url: str = "",
    driver_base_url: str = "",
    fabricmanager_base_url: str = "",
) -> None:
    """Propose NVIDIA's newer point releases, and the TODOs its files now give, as pull requests."""
    cli_tasks.propose_drivers(c, dry_run=dry_run, releases_url=releases_url,
                              versions_file=versions_file, checksum_base_url=checksum_base_url,
                              driver_base_url=driver_base_url,
                              fabricmanager_base_url=fabricmanager_base_url)  # fmt: skip


@task(help=task_options.PEERS_HELP, auto_shortflags=False)
def propose_peers(_c: Context, dry_run: bool = False, peers_file: str = "") -> None:
    """Propose the cluster session's peers at their newest releases the Go module proxy serves,
    each as a pull request (see tooling/gdc/peers.py)."""
    cli_tasks.propose_peers(dry_run=dry_run, peers_file=peers_file)


ns = Collection(tags, build, push_, matrix_, publish, sign, record_driver, propose_drivers,
                propose_peers)  # fmt: skip
ns.configure({task_options.CONFIG_SECTION: task_options.CONFIG_DEFAULTS})
