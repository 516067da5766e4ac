"""Build inputs: what an image was built from, recorded in a label and compared by publish.

Every image carries ``gpu-driver-container.build-inputs``, a JSON object of named digests:

* build image: ``entrypoint`` (the nvidia_driver package but its patches), ``patches``,
  ``dockerfile`` (images/build/), ``base`` (the base image's digest), ``driver`` (version and
  .run checksums), ``arguments`` (the other build arguments that shape the content);
* precompiled image: ``dockerfile`` (images/precompiled/ and the keyring), ``base`` (its build
  image's digest, so a rebuilt build image rebuilds it), ``releases`` (the Flatcar releases it
  carries packages for), ``arguments``.

Sources and provenance (download URLs, the commit, the date) are left out: a mirror or a new
commit does not change what is built, and the downloads are checked against their checksums
and signatures anyway. ``publish`` rebuilds an image whose recorded inputs differ, saying which
(:func:`changes`); an image that carries packages of more releases than wanted still serves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

INPUTS_LABEL = "gpu-driver-container.build-inputs"
RELEASES = "releases"
WHAT = {
    "entrypoint": "the entrypoint",
    "patches": "the compatibility patches",
    "dockerfile": "the Dockerfile",
    "base": "the base image",
    "driver": "the driver or its checksum",
    "arguments": "the build arguments",
}
# Build arguments that say where things come from or what an image was tagged for, not what
# it contains (or that another input already stands for).
NOT_INPUTS = frozenset({
    "GIT_COMMIT", "SOURCE_URL", "DRIVER_BASE_URL", "FABRICMANAGER_BASE_URL",
    "FLATCAR_RELEASE_BASE_URL", "FLATCAR_KEYRING", "BASE_IMAGE", "BUILD_IMAGE",
    "DRIVER_VERSION", "DRIVER_SHA256", "FLATCAR_VERSIONS",
})  # fmt: skip
_PATCHES = "entrypoint/src/nvidia_driver/kbuild/patches/"


def _digest(files: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()


def context_digests(directory: Path) -> dict[str, str]:
    """The digests of a build context's parts (see the module docstring)."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    relative = {p: str(p.relative_to(directory)) for p in files}
    if not any(name.startswith("entrypoint/") for name in relative.values()):
        return {"dockerfile": _digest(files, directory)}
    parts: dict[str, list[Path]] = {"entrypoint": [], "patches": [], "dockerfile": []}
    for path, name in relative.items():
        part = ("patches" if name.startswith(_PATCHES) else
                "entrypoint" if name.startswith("entrypoint/") else "dockerfile")  # fmt: skip
        parts[part].append(path)
    return {part: _digest(paths, directory) for part, paths in parts.items()}


def arguments_digest(buildargs: Mapping[str, str]) -> str:
    shaping = {key: value for key, value in buildargs.items() if key not in NOT_INPUTS}
    text = json.dumps(shaping, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def to_label(inputs: Mapping[str, str]) -> str:
    return json.dumps(dict(inputs), sort_keys=True, separators=(",", ":"))


def from_labels(labels: object) -> dict[str, str] | None:
    """The recorded inputs in an image config's labels, or None when it has none (or bad)."""
    text = labels.get(INPUTS_LABEL) if isinstance(labels, Mapping) else None
    try:
        recorded = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        return None
    return recorded


def changes(recorded: Mapping[str, str] | None, current: Mapping[str, str]) -> list[str]:
    """Why an image with the recorded inputs is not what current would build; [] if it is."""
    if recorded is None:
        return ["it records no build inputs"]
    found = []
    for key, value in current.items():
        if key == RELEASES:
            missing = sorted(set(value.split()) - set(recorded.get(key, "").split()))
            if missing:
                found.append(f"it lacks packages for Flatcar {', '.join(missing)}")
        elif recorded.get(key) != value:
            found.append(f"{WHAT.get(key, key)} changed")
    return found
