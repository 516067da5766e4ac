"""Which files are the reboot gate: what each deploy/reboot-gate folder's kustomization.yaml
lists, so that the tests apply and check exactly what ``kubectl apply -k`` installs.

kubectl's built-in kustomize renders a folder from its ``resources`` (files, or folders with
their own kustomization.yaml, such as ``../common``) and then applies its ``patches`` over them.
The patches here are whole documents of the same kind and name as a resource (kured's
namespace), so applying the files in that order, as ``kubectl apply -f`` would, gives the same
objects; the ``images`` transformer sets the image the manifests already name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "reboot-gate"
KUSTOMIZATION = "kustomization.yaml"


def kustomization(folder: Path) -> dict[str, Any]:
    """The folder's kustomization.yaml."""
    document: dict[str, Any] = yaml.safe_load((folder / KUSTOMIZATION).read_text())
    if document.get("kind") != "Kustomization":
        raise ValueError(f"{folder / KUSTOMIZATION} is not a Kustomization")
    return document


def patch_files(folder: Path) -> list[Path]:
    """The files of the folder's ``patches`` (only ``path:`` patches are used here)."""
    return [folder / patch["path"] for patch in kustomization(folder).get("patches", [])]


def manifests(folder: Path) -> list[Path]:
    """The files ``kubectl apply -k folder`` renders, each once, in the order that applying
    them one by one gives its objects: each resource (a folder's own files in its place), then
    the patches."""
    files: list[Path] = []
    for resource in kustomization(folder).get("resources", []):
        path = (folder / resource).resolve()
        files += manifests(path) if path.is_dir() else [path]
    files += [path.resolve() for path in patch_files(folder)]
    return list(dict.fromkeys(files))
