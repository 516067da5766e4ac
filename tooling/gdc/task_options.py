"""The options of tasks.py's tasks: their help texts, and the settings invoke's configuration gives.

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

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from gdc import compression as compressing
from gdc import peers as peering
from gdc import plan
from gdc import publish as publishing
from gdc.tags import TagError

CONFIG_SECTION = "images"
# What a task's --zstd-level is when it is not given: no level zstd has (1-22), and none that
# can be given on a command line either (invoke reads "-1" as an option), so that an explicit
# --zstd-level 0 is still refused as out of range.
LEVEL_NOT_GIVEN = -1
RETRY_BUDGET_SECONDS = int(publishing.RETRY_BUDGET_SECONDS)  # publish's --retry-budget


@dataclass(frozen=True)
class Configured:
    """The mirror and build settings from invoke's configuration ("" keeps the default)."""

    base_image: str = ""
    driver_base_url: str = ""
    fabricmanager_base_url: str = ""
    checksum_base_url: str = ""
    release_base_url: str = ""
    flatcar_keyring: str = ""
    releases_url: str = ""
    lts_info_url: str = ""
    docker_host: str = ""
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


_SELECTION = {
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
_BUILD = {
    **_SELECTION,
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
_MATRIX = {
    "json": "print one line of JSON for GitHub Actions (shape: tooling/gdc/matrix.py)",
    "github_output": "write that JSON as json=... to $GITHUB_OUTPUT (fails if it cannot)",
    **{key: _SELECTION[key] for key in ("registry", "image", "prefix", "ci_prefix",
                                        "releases_url")},
    "lts_info_url": "Flatcar's lts-info URL (default: $FLATCAR_LTS_INFO_URL or Flatcar's own)",
    "versions_file": "the versions file (default: versions.toml at the repository root)",
}  # fmt: skip
_PUBLISHED = {key: value for key, value in _MATRIX.items() if key not in {"json", "github_output"}}
_PUBLISH = {
    **_PUBLISHED,
    "registry": "where to publish, e.g. ghcr.io/<owner> (required)",
    "arch": "the arches to build here (default: versions.toml's; CI: one per native runner)",
    "step": "stage (build and push each arch), merge (write the multi-arch tags) or all",
    "variant": "only build or only precompiled images (default: both)",
    "rebuild": "rebuild every image, whatever its recorded build inputs say",
    "dry_run": "print the plan and the summary; build, push and tag nothing; no dockerd needed",
    "retry_budget": "seconds the whole run may wait on a rate-limiting (429) or failing (5xx) "
    f"registry; past them each image that meets one fails (default "
    f"{publishing.RETRY_BUDGET_SECONDS:.0f})",
    **{key: _BUILD[key] for key in ("base_image", "driver_base_url", "fabricmanager_base_url",
                                    "release_base_url", "flatcar_keyring", "network",
                                    "docker_host", "zstd_level")},
    "compression": "layers as published: zstd (default; each arch image recompressed in the "
    "registry after its push; needs Docker Engine >= 23, which pulls the zstd build images the "
    "precompiled ones start from) or gzip (dockerd 20.10, runtimes older than containerd 1.5)",
}  # fmt: skip
_SIGN = {
    **_PUBLISHED,
    "registry": "where the images are, e.g. ghcr.io/<owner> (required)",
    "key": "cosign key reference (default: keyless, with the CI job's OIDC token)",
    "sbom": "attest an SPDX SBOM made by syft (default); --no-sbom signs only",
    "require_cosign": "fail when cosign is not on PATH (default: say so, sign nothing)",
    "syft_sha256": "SHA-256 of the syft binary: any other syft is refused (the workflows pin it)",
}
_RECORD = {
    "version": "the NVIDIA datacenter driver release, e.g. 580.178.04",
    "verify": "also download each .run (about 400 MB) and check it against its .sha256sum",
    "versions_file": _MATRIX["versions_file"],
    "checksum_base_url": "where NVIDIA-Linux-*.run.sha256sum are (default: NVIDIA's XFree86 "
    "downloads)",
    "driver_base_url": _BUILD["driver_base_url"],
    "fabricmanager_base_url": "NVIDIA's redist base with redistrib_<version>.json, a mirror",
}

TAGS_HELP = _with_config_keys(_SELECTION)
BUILD_HELP = _with_config_keys(_BUILD)
PUSH_HELP = _with_config_keys(
    {**_SELECTION, **{key: _BUILD[key] for key in ("docker_host", "compression", "zstd_level")}}
)
MATRIX_HELP = _with_config_keys(_MATRIX)
PUBLISH_HELP = _with_config_keys(_PUBLISH)
SIGN_HELP = _with_config_keys(_SIGN)
RECORD_HELP = _with_config_keys(_RECORD)
# Its --releases-url is NVIDIA's releases.json, not Flatcar's: not the configured one.
PROPOSE_HELP = {
    **{key: value for key, value in RECORD_HELP.items() if key not in {"version", "verify"}},
    "dry_run": "print each proposal's change to versions.toml; no branch, no pull request",
    "releases_url": "NVIDIA's releases.json (default: docs.nvidia.com/datacenter/tesla/drivers/)",
}
PEERS_HELP = {
    "dry_run": "print each change; lock, commit, push and open nothing",
    "peers_file": f"the peers file (default: {peering.PEERS_FILE} in this repository)",
}
