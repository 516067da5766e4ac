"""Compatibility patches for NVIDIA's kernel module sources.

Older driver branches stop building when a kernel changes an interface they use, and NVIDIA fixes
that late or never. The patches shipped next to this module (``patches/<branch>/<name>.patch``)
bridge the gap. ``patches/index.json`` says, for each one, the driver branches and the kernel
range it is for, which source tree it patches (``kernel-open`` or ``kernel``) and why:

    {"format": 1, "patches": [{"name": ..., "file": "535/x.patch", "branches": [535],
     "min_kernel": "6.12.97", "max_kernel": null, "trees": ["kernel-open"],
     "reason": ..., "note": ...}]}

``max_kernel`` is exclusive and optional. Patch paths are relative to the tree they patch, so
they apply with ``patch -p1`` from inside ``kernel-open/`` or ``kernel/``.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.modules import SOURCE_DIRS
from nvidia_driver.log import say
from nvidia_driver.naming import KERNEL_VERSION_RE, KernelVersion, parse_kernel_release

PATCH_DIR = Path(__file__).with_name("patches")
INDEX_NAME = "index.json"
INDEX_FORMAT = 1
TREES = frozenset(SOURCE_DIRS.values())

_ENTRY_KEYS = frozenset(
    {"name", "file", "branches", "min_kernel", "max_kernel", "trees", "reason", "note"}
)
_PATCH_ARGS = ("-p1", "--forward", "--batch")
_PATCH_PROBLEM = re.compile(r"FAILED|Reversed|can't find|malformed|garbage|No such file")


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    branches: frozenset[int]
    min_kernel: KernelVersion
    max_kernel: KernelVersion | None
    trees: frozenset[str]
    reason: str
    note: str

    def covers_kernel(self, kernel: KernelVersion) -> bool:
        below_max = self.max_kernel is None or kernel < self.max_kernel
        return self.min_kernel <= kernel and below_max

    def applies_to(self, branch: int, kernel: KernelVersion, tree: str) -> bool:
        return branch in self.branches and tree in self.trees and self.covers_kernel(kernel)


def _malformed(index: Path, what: str) -> DriverError:
    return DriverError(f"{index} is malformed: {what}; the image is broken, report a bug")


def _text(entry: Mapping[str, object], key: str, index: Path) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _malformed(index, f"{key!r} must be a non-empty string in {entry!r}")
    return value


def _kernel(entry: Mapping[str, object], key: str, index: Path) -> KernelVersion:
    text = _text(entry, key, index)
    if not KERNEL_VERSION_RE.fullmatch(text):
        raise _malformed(index, f"{key!r} must be a kernel version like 6.12.97, not {text!r}")
    return parse_kernel_release(text)


def _branches(entry: Mapping[str, object], index: Path) -> frozenset[int]:
    value = entry.get("branches")
    if not isinstance(value, list) or not value:
        raise _malformed(index, f"'branches' must be a non-empty list in {entry!r}")
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise _malformed(index, f"'branches' must hold integers like 535 in {entry!r}")
    return frozenset(value)


def _trees(entry: Mapping[str, object], index: Path) -> frozenset[str]:
    value = entry.get("trees")
    if not isinstance(value, list) or not value or not set(value) <= TREES:
        raise _malformed(index, f"'trees' must list some of {sorted(TREES)} in {entry!r}")
    return frozenset(value)


def _patch_file(entry: Mapping[str, object], patch_dir: Path, index: Path) -> Path:
    path = patch_dir / _text(entry, "file", index)
    if not path.is_file():
        raise _malformed(index, f"{path} is listed but missing")
    return path


def _patch(entry: object, patch_dir: Path, index: Path) -> Patch:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise _malformed(index, f"each patch needs exactly the keys {sorted(_ENTRY_KEYS)}")
    patch = Patch(
        name=_text(entry, "name", index),
        path=_patch_file(entry, patch_dir, index),
        branches=_branches(entry, index),
        min_kernel=_kernel(entry, "min_kernel", index),
        max_kernel=None if entry["max_kernel"] is None else _kernel(entry, "max_kernel", index),
        trees=_trees(entry, index),
        reason=_text(entry, "reason", index),
        note=_text(entry, "note", index),
    )
    if patch.max_kernel is not None and patch.max_kernel <= patch.min_kernel:
        raise _malformed(index, f"{patch.name}: max_kernel must be above min_kernel")
    return patch


def load_index(patch_dir: Path) -> tuple[Patch, ...]:
    """Every patch listed in ``<patch_dir>/index.json``, checked for well-formedness."""
    index = patch_dir / INDEX_NAME
    try:
        document = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise _malformed(index, str(exc)) from exc
    if not isinstance(document, dict) or document.get("format") != INDEX_FORMAT:
        raise _malformed(index, f'expected an object with "format": {INDEX_FORMAT}')
    entries = document.get("patches")
    if not isinstance(entries, list):
        raise _malformed(index, "'patches' must be a list")
    return tuple(_patch(entry, patch_dir, index) for entry in entries)


@functools.cache
def shipped_patches() -> tuple[Patch, ...]:
    return load_index(PATCH_DIR)


def select_patches(branch: int, kernel_release: str, module_type_dir: str) -> list[Patch]:
    """The shipped patches that the sources of a driver branch need for a kernel and tree."""
    if module_type_dir not in TREES:
        msg = f"module_type_dir must be one of {sorted(TREES)}, not {module_type_dir!r}"
        raise ValueError(msg)
    kernel = parse_kernel_release(kernel_release)
    return [
        patch for patch in shipped_patches() if patch.applies_to(branch, kernel, module_type_dir)
    ]


def _problem(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    fallback = lines[-1] if lines else f"exit {result.returncode}"
    return next((line for line in lines if _PATCH_PROBLEM.search(line)), fallback)


def _run_patch(patch: Patch, source_dir: Path, commands: Commands, *extra: str) -> None:
    result = commands.run(
        "patch", *_PATCH_ARGS, *extra, "-i", patch.path, cwd=source_dir, check=False
    )
    if result.returncode != 0:
        raise DriverError(
            f"patch {patch.name} ({patch.path.parent.name}/{patch.path.name}) does not apply to "
            f"the driver sources in {source_dir}: {_problem(result)}; this driver version may "
            "already carry the fix or have changed the patched code: pick another driver "
            "version, or report it with the driver version and kernel release"
        )


def apply_patches(patches: Iterable[Patch], source_dir: Path, commands: Commands) -> None:
    """Apply each patch inside ``source_dir``, the kernel-open/ or kernel/ directory.

    A dry run goes first, so that a patch which does not apply whole leaves no hunks behind.
    """
    for patch in patches:
        say(f"Applying patch {patch.name}: {patch.reason}")
        _run_patch(patch, source_dir, commands, "--dry-run")
        _run_patch(patch, source_dir, commands)
