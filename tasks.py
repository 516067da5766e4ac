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

from gdc import cli_tasks  # noqa: E402
from gdc.task_options import (  # noqa: E402
    CONFIG_DEFAULTS,
    CONFIG_SECTION,
    MATRIX,
    MIRRORS,
    NVIDIA_FILES,
    PEERS_HELP,
    PROPOSE_HELP,
    PUBLISH_HELP,
    PUSHING,
    RECORD_HELP,
    REQUIRED,
    SELECTION,
    SIGN_HELP,
    Given,
    options,
)

# Each task names its options, defined once in gdc/task_options.py (a default, a help text):
# invoke reads the task's signature and help from there, and the task gets them as one Given.


@options(*SELECTION)
def tags(c: Context, given: Given) -> None:
    """Print the tags a build would get, building nothing."""
    cli_tasks.tags(c, given)


@options(*SELECTION, "push", "driver_sha256", "redist_sha256", *MIRRORS, *PUSHING)
def build(c: Context, given: Given) -> None:
    """Build a driver image (a precompiled build also builds its build image)."""
    cli_tasks.build(c, given)


@options(*SELECTION, *PUSHING, name="push")
def push_(c: Context, given: Given) -> None:
    """Push the tags of an earlier invoke build (same options) to the registry."""
    cli_tasks.push(c, given)


@options("json", "github_output", *MATRIX, name="matrix")
def matrix_(c: Context, given: Given) -> None:
    """List every image to publish: live Flatcar releases x drivers x arches."""
    cli_tasks.matrix_(c, given)


@options(*MATRIX, "arch", "step", "variant", "rebuild", "dry_run", *MIRRORS, "retry_budget",
         *PUSHING, help=PUBLISH_HELP, defaults={"variant": ""})  # fmt: skip
def publish(c: Context, given: Given) -> None:
    """Build and push what the registry lacks or what changed; merge the arches; summarize."""
    cli_tasks.publish(c, given)


@options(*MATRIX, "key", "sbom", "require_cosign", "syft_sha256", help=SIGN_HELP)
def sign(c: Context, given: Given) -> None:
    """Sign each published image of the matrix with cosign and attest its SBOM."""
    cli_tasks.sign(c, given)


@options("version", "verify", *NVIDIA_FILES, help=RECORD_HELP,
         defaults={"version": REQUIRED})  # fmt: skip
def record_driver(c: Context, given: Given) -> None:
    """Write versions.toml's entry for VERSION from NVIDIA's own checksums and redist manifest."""
    cli_tasks.record_driver(c, given)


@options("dry_run", "releases_url", *NVIDIA_FILES, help=PROPOSE_HELP)
def propose_drivers(c: Context, given: Given) -> None:
    """Propose NVIDIA's newer point releases, and the TODOs its files now give, as pull requests."""
    cli_tasks.propose_drivers(c, given)


@options("dry_run", "peers_file", help=PEERS_HELP)
def propose_peers(_c: Context, given: Given) -> None:
    """Propose the cluster session's peers at their newest releases the Go module proxy serves,
    each as a pull request (see tooling/gdc/peers.py)."""
    cli_tasks.propose_peers(given)


ns = Collection(tags, build, push_, matrix_, publish, sign, record_driver, propose_drivers,
                propose_peers)  # fmt: skip
ns.configure({CONFIG_SECTION: CONFIG_DEFAULTS})
