"""A driver patch made at test time, outside the shipped catalog (for the kbuild tests)."""

from __future__ import annotations

from pathlib import Path

from nvidia_driver.kbuild.patches import Patch
from nvidia_driver.naming import KernelVersion


def synthetic_patch(tmp_path: Path, text: str) -> Patch:
    """A patch of that diff text for a branch that does not exist, from kernel 6.1 on."""
    path = tmp_path / "patches" / "demo.patch"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return Patch(
        name="demo",
        path=path,
        branches=frozenset({999}),
        min_kernel=KernelVersion(6, 1, 0),
        max_kernel=None,
        trees=frozenset({"kernel-open"}),
        reason="the answer is 42",
        note="synthetic",
    )
