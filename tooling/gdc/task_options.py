"""The options of tasks.py's tasks, each defined once; the settings invoke's configuration gives.

Every option is a field of :class:`Given`, its default there and its help in :data:`HELP`; a
task names the options it takes (:func:`options`), and invoke reads that task's signature and
help from them (``invoke --help build``). The task's body gets them as one :class:`Given`.

Mirror and build settings (base image, download URLs, keyring, dockerd, compression) come from
invoke's configuration, section ``images``, read once per task by :meth:`Configured.of`. tasks.py
declares the defaults (:data:`CONFIG_DEFAULTS`); invoke lets these override them, last wins:
``/etc/invoke.yaml``, ``~/.invoke.yaml``, ``invoke.yaml`` beside tasks.py, ``INVOKE_IMAGES_<KEY>``
environment variables (``INVOKE_IMAGES_BASE_IMAGE=...``), and ``invoke -f FILE``. A task's
option wins over all of them. A setting left empty keeps its older source: ``releases_url``
``$FLATCAR_RELEASES_URL``, ``lts_info_url`` ``$FLATCAR_LTS_INFO_URL``, ``docker_host``
``$DOCKER_HOST``, then the built-in default.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from invoke.tasks import task

from gdc import compression as compressing
from gdc import peers as peering
from gdc import plan
from gdc import publish as publishing
from gdc.tags import DEFAULT_IMAGE, TagError, Variant

CONFIG_SECTION = "images"
# What a task's --zstd-level is when it is not given: no level zstd has (1-22), and none that
# can be given on a command line either (invoke reads "-1" as an option), so that an explicit
# --zstd-level 0 is still refused as out of range.
LEVEL_NOT_GIVEN = -1
RETRY_BUDGET_SECONDS = int(publishing.RETRY_BUDGET_SECONDS)  # publish's --retry-budget
REQUIRED = inspect.Parameter.empty  # the default of a positional argument: none


@dataclass(frozen=True)
class Settings:
    """The mirror and build settings invoke's configuration may give, each also an option: ""
    or LEVEL_NOT_GIVEN is not given."""

    base_image: str = ""
    driver_base_url: str = ""
    fabricmanager_base_url: str = ""
    checksum_base_url: str = ""
    release_base_url: str = ""
    flatcar_keyring: str = ""
    releases_url: str = ""
    lts_info_url: str = ""
    docker_host: str = ""
    network: str = ""
    compression: str = ""
    zstd_level: int = LEVEL_NOT_GIVEN


@dataclass(frozen=True)
class Given(Settings):
    """Every task's options as invoke parsed them; a task has some of them. "" or
    LEVEL_NOT_GIVEN: not given, so invoke's configuration or the built-in default applies."""

    variant: str = Variant.PRECOMPILED.value
    driver_version: str = ""
    flatcar_version: str = ""
    arch: str = ""
    registry: str = ""
    image: str = DEFAULT_IMAGE
    prefix: str = ""
    ci_prefix: bool = False
    versions_file: str = ""
    push: bool = False
    driver_sha256: str = ""
    redist_sha256: str = ""
    json: bool = False
    github_output: bool = False
    step: str = publishing.Step.ALL.value
    rebuild: bool = False
    dry_run: bool = False
    retry_budget: int = RETRY_BUDGET_SECONDS
    key: str = ""
    sbom: bool = True
    require_cosign: bool = False
    syft_sha256: str = ""
    version: str = ""
    verify: bool = False
    peers_file: str = ""


@dataclass(frozen=True)
class Configured(Settings):
    """The settings from invoke's configuration, with their built-in defaults ("" keeps the
    default of the setting's older source, module docstring)."""

    network: str = "host"
    compression: str = compressing.Compression.ZSTD.value
    zstd_level: int = compressing.DEFAULT_LEVEL

    @classmethod
    def of(cls, section: object) -> Configured:
        """From the ``images`` section of invoke's configuration (None: a MockContext's)."""
        section = section or {}
        if not isinstance(section, Mapping):
            raise TagError(f"invoke's configuration {CONFIG_SECTION!r} is not a mapping")
        known = {field.name: field for field in fields(cls)}
        values: dict[str, object] = {}
        for key, value in section.items():
            if key not in known:
                raise TagError(f"invoke's configuration has no setting {CONFIG_SECTION}.{key}: "
                               f"use {', '.join(known)}")  # fmt: skip
            wanted = int if key == "zstd_level" else str
            if not isinstance(value, wanted) or isinstance(value, bool):
                kind = "a whole number" if wanted is int else "a string"
                raise TagError(f"invoke's configuration {CONFIG_SECTION}.{key} is {value!r}: "
                               f"give {kind}")  # fmt: skip
            values[key] = value
        return cls(**values)  # type: ignore[arg-type]  # each value's type is checked above

    def given(self, **options: str | int) -> Configured:
        """These settings with the options a task was given over them ("" or LEVEL_NOT_GIVEN:
        not given)."""
        chosen = {key: value for key, value in options.items()
                  if value not in {"", LEVEL_NOT_GIVEN}}  # fmt: skip
        return replace(self, **chosen)  # type: ignore[arg-type]

    def over(self, given: Given) -> Configured:
        """These settings with a task's options of the same names over them."""
        return self.given(**{key: getattr(given, key) for key in CONFIGURED})

    @property
    def upstream(self) -> plan.Upstream:
        keyring = Path(self.flatcar_keyring) if self.flatcar_keyring else None
        return plan.Upstream(self.base_image, self.driver_base_url, self.fabricmanager_base_url,
                             self.release_base_url, keyring)  # fmt: skip


CONFIG_DEFAULTS = asdict(Configured())
CONFIGURED = frozenset(CONFIG_DEFAULTS)


def _with_config_keys(help_texts: dict[str, str]) -> dict[str, str]:
    """Each configurable option's help names its key in invoke's configuration."""
    return {key: f"{text} [invoke config: {CONFIG_SECTION}.{key}]" if key in CONFIGURED else text
            for key, text in help_texts.items()}  # fmt: skip


HELP = _with_config_keys({
    # What to build, and how it is tagged (tags, build, push; matrix, publish and sign cover
    # every image of the matrix, and take the last five).
    "variant": "build (compiles on the node) or precompiled (one per Flatcar kernel)",
    "driver_version": "NVIDIA driver version or branch (default: newest in versions.toml)",
    "flatcar_version": "Flatcar release (default: current stable, from the releases feed)",
    "arch": "amd64, arm64, a comma list, or 'all' (multi-arch: buildx, needs --push)",
    "registry": "repository prefix, as the Operator's driver.repository (e.g. ghcr.io/me)",
    "image": "image name, as the Operator's driver.image (default: driver)",
    "prefix": "tag prefix for test builds, e.g. flatcar-test-<sha8>",
    "ci_prefix": "prefix from GitHub Actions: flatcar-test-<sha8> on a branch, none on a tag",
    "releases_url": "Flatcar releases.json URL (default: $FLATCAR_RELEASES_URL or flatcar.org)",
    "lts_info_url": "Flatcar's lts-info URL (default: $FLATCAR_LTS_INFO_URL or Flatcar's own)",
    "versions_file": "the versions file (default: versions.toml at the repository root)",
    # How it is built and pushed.
    "push": "push every tag after building",
    "driver_sha256": "the .run's SHA-256 (HEX or amd64=HEX,arm64=HEX) instead of versions.toml",
    "redist_sha256": "the redist archives' SHA-256s (fabricmanager.amd64=HEX,...) instead of "
    "versions.toml",
    "base_image": "base image of the build image (default: the Dockerfile's pinned Debian)",
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
    # matrix
    "json": "print one line of JSON for GitHub Actions (shape: tooling/gdc/matrix.py)",
    "github_output": "write that JSON as json=... to $GITHUB_OUTPUT (fails if it cannot)",
    # publish
    "step": "stage (build and push each arch), merge (write the multi-arch tags) or all",
    "rebuild": "rebuild every image, whatever its recorded build inputs say",
    "dry_run": "print the plan and the summary; build, push and tag nothing; no dockerd needed",
    "retry_budget": "seconds the whole run may wait on a rate-limiting (429) or failing (5xx) "
    f"registry; past them each image that meets one fails (default "
    f"{publishing.RETRY_BUDGET_SECONDS:.0f})",
    # sign
    "key": "cosign key reference (default: keyless, with the CI job's OIDC token)",
    "sbom": "attest an SPDX SBOM made by syft (default); --no-sbom signs only",
    "require_cosign": "fail when cosign is not on PATH (default: say so, sign nothing)",
    "syft_sha256": "SHA-256 of the syft binary: any other syft is refused (the workflows pin it)",
    # record-driver, propose-drivers, propose-peers
    "version": "the NVIDIA datacenter driver release, e.g. 580.178.04",
    "verify": "also download each .run (about 400 MB) and check it against its .sha256sum",
    "checksum_base_url": "where NVIDIA-Linux-*.run.sha256sum are (default: NVIDIA's XFree86 "
    "downloads)",
    "peers_file": f"the peers file (default: {peering.PEERS_FILE} in this repository)",
})  # fmt: skip

# The option groups several tasks share.
TAGGED = ("registry", "image", "prefix", "ci_prefix", "releases_url")
SELECTION = ("variant", "driver_version", "flatcar_version", "arch", *TAGGED)
MATRIX = (*TAGGED, "lts_info_url", "versions_file")
MIRRORS = ("base_image", "driver_base_url", "fabricmanager_base_url", "release_base_url",
           "flatcar_keyring", "network")  # fmt: skip
PUSHING = ("docker_host", "compression", "zstd_level")
NVIDIA_FILES = ("versions_file", "checksum_base_url", "driver_base_url", "fabricmanager_base_url")

# Where one task's option means something of its own.
PUBLISH_HELP = _with_config_keys({
    "registry": "where to publish, e.g. ghcr.io/<owner> (required)",
    "arch": "the arches to build here (default: versions.toml's; CI: one per native runner)",
    "variant": "only build or only precompiled images (default: both)",
    "compression": "layers as published: zstd (default; each arch image recompressed in the "
    "registry after its push; needs Docker Engine >= 23, which pulls the zstd build images the "
    "precompiled ones start from) or gzip (dockerd 20.10, runtimes older than containerd 1.5)",
})  # fmt: skip
SIGN_HELP = {"registry": "where the images are, e.g. ghcr.io/<owner> (required)"}
RECORD_HELP = _with_config_keys(
    {"fabricmanager_base_url": "NVIDIA's redist base with redistrib_<version>.json, a mirror"}
)
# Its --releases-url is NVIDIA's releases.json, not Flatcar's: not the configured one.
PROPOSE_HELP = {
    **RECORD_HELP,
    "dry_run": "print each proposal's change to versions.toml; no branch, no pull request",
    "releases_url": "NVIDIA's releases.json (default: docs.nvidia.com/datacenter/tesla/drivers/)",
}
PEERS_HELP = {"dry_run": "print each change; lock, commit, push and open nothing"}


def options(
    *names: str,
    name: str | None = None,
    help: Mapping[str, str] | None = None,  # noqa: A002 - invoke's word for it
    defaults: Mapping[str, object] | None = None,
) -> Callable[[Callable[[Any, Given], None]], Any]:
    """The invoke task of a body ``(c, given)`` that takes the options ``names`` (a positional
    argument first, its default :data:`REQUIRED`): invoke reads their signature, with
    :class:`Given`'s defaults or ``defaults``, and their help, :data:`HELP`'s or ``help``."""
    values = {field.name: field.default for field in fields(Given)} | dict(defaults or {})
    signature = inspect.Signature([
        inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(option, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            default=values[option]) for option in names),
    ])  # fmt: skip
    texts = {option: (help or {}).get(option) or HELP[option] for option in names}

    def decorate(body: Callable[[Any, Given], None]) -> Any:
        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> None:
            bound = signature.bind(*args, **kwargs)  # a call as invoke makes it, or a test
            bound.apply_defaults()
            c = bound.arguments.pop("c")
            body(c, Given(**bound.arguments))

        run.__signature__ = signature  # type: ignore[attr-defined]  # what invoke reads
        return task(run, name=name, help=texts, auto_shortflags=False)

    return decorate
