"""A cached package replaced while a SIGKILL comes: the cache holds the old package or the new
one, never none, and the sweep init runs under its pid lock removes what the kill left.

The replace runs in a child process that kills itself with SIGKILL at a real point of it: the
child wraps the one step that swaps the trees (atomic._exchange) to die just before it, or just
after it, before the old tree is removed. The production code has no branch for the test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_driver import atomic
from nvidia_driver.kbuild.cachedirs import sweep_stale
from nvidia_driver.kbuild.packages import Package, PackageMetadata, load_package, write_package

KERNEL = "6.12.81-flatcar"
# Writes the package of metadata argv[4] over the one at argv[2], killed at argv[1] ("before"
# or "after" the exchange).
CHILD = """
import os, signal, sys
from pathlib import Path
from nvidia_driver import atomic
from nvidia_driver.kbuild.packages import PackageMetadata, write_package

when, destination, module = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
exchange = atomic._exchange

def killed(first, second):
    if when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    exchange(first, second)
    os.kill(os.getpid(), signal.SIGKILL)

atomic._exchange = killed
write_package(destination, PackageMetadata.from_json(sys.argv[4]), {"nvidia.ko": module})
"""


def metadata(label: str) -> PackageMetadata:
    return PackageMetadata(
        banner=f"Linux version {KERNEL}",
        kernel_release=KERNEL,
        driver_version="580.105.08",
        module_type="open",
        compiler=label,
        source_digest=f"sha256:{label}",
        modules=["nvidia.ko"],
    )


def package_in(cache: Path) -> Path:
    return cache / "packages" / "580.105.08" / "open" / f"{KERNEL}-0123456789ab"


def old_package(tmp_path: Path) -> Package:
    module = tmp_path / "old.ko"
    module.write_bytes(b"old module\n" * 1000)
    return write_package(package_in(tmp_path / "cache"), metadata("old"), {"nvidia.ko": module})


@pytest.mark.parametrize(("when", "found"), [("before", "old"), ("after", "new")])
def test_a_replace_killed_between_its_steps_leaves_a_whole_package(
    tmp_path: Path, when: str, found: str
) -> None:
    old = old_package(tmp_path)
    old_module = (old.path / "nvidia.ko").read_bytes()
    module = tmp_path / "new.ko"
    module.write_bytes(b"new module\n" * 2000)

    child = subprocess.run(
        [sys.executable, "-c", CHILD, when, str(old.path), str(module), metadata("new").to_json()],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip

    assert child.returncode == -signal.SIGKILL, child.stderr
    package = load_package(old.path)
    assert package is not None, "no package at all after the kill"
    assert package.damaged_file() is None
    assert package.metadata.compiler == found
    assert (package.path / "nvidia.ko").read_bytes() == {
        "old": old_module,
        "new": module.read_bytes(),
    }[found]
    # The killed replace left its staging directory: the other tree, under a dot name.
    [left] = [entry for entry in old.path.parent.iterdir() if entry != old.path]
    assert left.name.startswith(f".{old.path.name}.")

    swept = sweep_stale(tmp_path / "cache", tmp_path / "work")

    assert swept == [left]
    assert list(old.path.parent.iterdir()) == [old.path]
    assert load_package(old.path) == package
    assert package.damaged_file() is None


@pytest.mark.parametrize("exchange", [True, False], ids=["exchanged", "moved-aside"])
def test_a_completed_replace_leaves_only_the_new_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:  # a filesystem without RENAME_EXCHANGE (NFS), an old kernel or libc
        monkeypatch.setattr(atomic, "_exchange", lambda *_: False)
    old = old_package(tmp_path)
    module = tmp_path / "new.ko"
    module.write_bytes(b"new module\n")

    new = write_package(old.path, metadata("new"), {"nvidia.ko": module})

    assert list(old.path.parent.iterdir()) == [old.path]
    assert load_package(old.path) == new
    assert (new.path / "nvidia.ko").read_bytes() == b"new module\n"
