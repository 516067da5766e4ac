"""Where a build keeps what it fetches and makes: two directories, by size and lifetime.

``/run`` is a tmpfs on Flatcar: what lies there is the node's RAM, on a GPU node about to run
jobs. So only small results worth keeping across pod restarts go there, and the large transient
material of a build goes to the container's own writable layer, which is on the node's disk and
goes away with the container::

    /run/nvidia/cache (NVIDIA_DRIVER_CACHE_DIR), a hostPath: kept across pod restarts
        packages/<driver>/<type>/<kernel>-<banner key>/   built packages (tens of MB each)
        banners/<key>                                     kernel banners read from a vmlinuz
        logs/                                             the last build logs

    /var/cache/nvidia-driver (NVIDIA_DRIVER_WORK_DIR), in the container: transient
        downloads/        verified downloads (a vmlinuz, a developer container: ~480 MB) and
                          the downloads in flight (.scratch-*)
        trees/            kernel build trees: the host's copy, flatcar-container.tar.gz's
        devcontainers/    unpacked developer containers (several GB)
        builds/           the compile directories (NVIDIA's sources and objects)

A runtime build (``init``, or ``build`` for the running node) empties the work directory when it
is done. ``build --flatcar-version`` leaves it for the next build of the same release: the
precompiled image builds the open and then the proprietary modules, and its builder stage is
thrown away. ``init`` sweeps, under its pid lock, what a killed run left behind: the work
directory, and the half-written entries (``.scratch-*``, ``.incoming-*``, staging directories)
in the cache. A package or tree replaced when the kill came is whole, the old or the new one;
the other is in the staging directory beside it (atomic.replacing), swept with the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from nvidia_driver.atomic import remove
from nvidia_driver.log import say
from nvidia_driver.settings import NVIDIA_DRIVER_CACHE_DIR, NVIDIA_DRIVER_WORK_DIR

# Names of entries being written: a download in flight, an extraction, a compile, a staged
# package. A finished entry never has such a name.
_IN_FLIGHT = (".scratch-", ".incoming-", ".build.")
# Where in the cache entries are staged: downloads/ (older images kept them in /run), trees/
# (likewise), packages/<driver>/<type>/.
_STAGING_DIRS = ("downloads", "trees", "packages/*/*")


def _configured(default: Path, env: Mapping[str, str], name: str) -> Path:
    configured = env.get(name, "").strip()
    return Path(configured) if configured else default


def cache_dir(default: Path, env: Mapping[str, str]) -> Path:
    """The small, kept cache: ``NVIDIA_DRIVER_CACHE_DIR``, else ``default``."""
    return _configured(default, env, NVIDIA_DRIVER_CACHE_DIR)


def work_dir(default: Path, env: Mapping[str, str]) -> Path:
    """The large, transient work directory: ``NVIDIA_DRIVER_WORK_DIR``, else ``default``."""
    return _configured(default, env, NVIDIA_DRIVER_WORK_DIR)


def _stale_entries(cache: Path) -> Iterator[Path]:
    for pattern in _STAGING_DIRS:
        for directory in sorted(cache.glob(pattern)):
            if directory.is_symlink() or not directory.is_dir():
                continue
            for entry in sorted(directory.iterdir()):
                staged = entry.name.startswith(".") and not entry.name.endswith(".lock")
                if entry.name.startswith(_IN_FLIGHT) or (pattern != "downloads" and staged):
                    yield entry


def sweep_stale(cache: Path, work: Path) -> list[Path]:
    """Remove what killed runs left: call only while holding the pid lock. Returns it."""
    swept = list(_stale_entries(cache))
    if work.is_dir() and not work.is_symlink():
        swept += sorted(work.iterdir())
    for path in swept:
        remove(path, ignore_errors=True)
    if swept:
        say(f"Removed {len(swept)} entries left by an interrupted run in {cache} and {work}")
    return swept


def clear_work(work: Path) -> None:
    """Empty the work directory after a runtime build: its trees are GBs of node disk."""
    if work.is_dir() and not work.is_symlink():
        for entry in work.iterdir():
            remove(entry, ignore_errors=True)
