"""Small build contexts: only what each Dockerfile copies, never the whole work tree.

The build image's context mirrors the repository layout (``entrypoint/src/nvidia_driver``,
``images/build/``, ``LICENSE`` and ``NOTICE``), so ``docker build -f images/build/Dockerfile .``
at the root works the same.
The precompiled image's context is ``images/precompiled/`` plus, for mirrors and tests, one
keyring under ``keyrings/``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gdc.tags import Variant

ROOT = Path(__file__).resolve().parents[2]
KEYRINGS_IN_IMAGE = PurePosixPath("/etc/gdc/keyrings")
# The project's licence and the notice on NVIDIA's components travel in every image.
LEGAL_FILES = ("LICENSE", "NOTICE")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


@dataclass(frozen=True)
class Context:
    """A laid-out context; what it holds is digested by gdc.inputs.context_digests."""

    directory: Path
    dockerfile: str  # relative to directory
    keyring: str = ""  # FLATCAR_KEYRING inside the builder stage; "" for Flatcar's own key


def assemble(variant: Variant, destination: Path, keyring: Path | None = None) -> Context:
    """Lay out the context for variant in destination (an empty or missing directory)."""
    destination.mkdir(parents=True, exist_ok=True)
    if variant is Variant.BUILD:
        return _build_context(destination)
    return _precompiled_context(destination, keyring)


def _build_context(destination: Path) -> Context:
    package = PurePosixPath("entrypoint/src/nvidia_driver")
    shutil.copytree(ROOT / package, destination / package, ignore=_IGNORED)
    shutil.copytree(ROOT / "images/build", destination / "images/build", ignore=_IGNORED)
    for name in LEGAL_FILES:
        shutil.copyfile(ROOT / name, destination / name)
    return Context(destination, "images/build/Dockerfile")


def _precompiled_context(destination: Path, keyring: Path | None) -> Context:
    shutil.copytree(ROOT / "images/precompiled", destination, dirs_exist_ok=True, ignore=_IGNORED)
    if keyring is None:
        return Context(destination, "Dockerfile")
    shutil.copyfile(keyring, destination / "keyrings" / keyring.name)
    return Context(destination, "Dockerfile", str(KEYRINGS_IN_IMAGE / keyring.name))
