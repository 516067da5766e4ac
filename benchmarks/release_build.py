"""The runtime build, side by side with what it cannot avoid, in one run (needs root).

Against the integration fixtures (a Flatcar release server on 127.0.0.1 serving Debian's
6.12.95 kernel, and NVIDIA 535.261.03 from a fixture .run), it prints:

1. the runtime build (``nvidia-driver build --flatcar-version``, the code init runs when no
   package matches) divided by a bare ``make modules`` of the same sources on the same tree;
2. a rebuild with a warm cache (goal: no compile, at most 3 s);
3. streaming flatcar-container.tar.gz into the tree extractor divided by only downloading it,
   both verified, at a mirror-like bandwidth (and, for the record, over raw loopback).

Usage: python benchmarks/release_build.py [--bandwidth-mb 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from fixtures.gpg import generate_signing_key
from fixtures.kernel import kernel_tree
from fixtures.release_server import (
    CONTAINER_TARBALL,
    TEST_RELEASE,
    FlatcarReleaseServer,
    build_release_artifacts,
    sign_release,
)
from fixtures.runfile import build_run_fixture

from nvidia_driver.commands import Commands
from nvidia_driver.fetch import Fetcher
from nvidia_driver.kerneltree import extract_container_tree

DRIVER = "535.261.03"
RUNTIME_BUILD_GOAL = 1.15
WARM_GOAL_SECONDS = 3.0
STREAM_GOAL = 1.1


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def driver_root(scratch: Path) -> Path:
    runfile = build_run_fixture(DRIVER)
    extracted = scratch / "run"
    subprocess.run(["sh", runfile, "-x", "--target", extracted], check=True, capture_output=True)
    root = scratch / "root"
    sources = root / "usr" / "src" / f"nvidia-{DRIVER}"
    sources.mkdir(parents=True)
    for tree in ("kernel", "kernel-open"):
        shutil.copytree(extracted / tree, sources / tree, symlinks=True)
    return root


def build_command(
    root: Path, cache: Path, server: FlatcarReleaseServer, keyring: Path
) -> Callable[[], None]:
    env = {
        **os.environ,
        "NVIDIA_DRIVER_HOST_ROOT": str(root),
        "NVIDIA_DRIVER_CACHE_DIR": str(cache),
        "FLATCAR_RELEASE_BASE_URL": server.base_url,
        "FLATCAR_KEYRING": str(keyring),
        "DRIVER_VERSION": DRIVER,
        "TARGETARCH": "amd64",
    }
    argv = [sys.executable, "-m", "nvidia_driver", "build", "--flatcar-version",
            TEST_RELEASE.version, "--module-type", "open"]  # fmt: skip

    def run() -> None:
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)

    return run


def bare_make(root: Path, tree: Path, scratch: Path) -> Callable[[], None]:
    sources = scratch / "bare"
    shutil.copytree(root / "usr/src" / f"nvidia-{DRIVER}" / "kernel-open", sources, symlinks=True)
    argv = ["make", "-C", str(sources), f"-j{os.cpu_count()}", "modules",
            f"SYSSRC={tree}", f"SYSOUT={tree}", "CC=gcc-12", "IGNORE_CC_MISMATCH=1"]  # fmt: skip

    def run() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    return run


def stream_ratio(server: FlatcarReleaseServer, keyring: Path, scratch: Path) -> tuple[float, float]:
    url = server.artifact_url(CONTAINER_TARBALL)
    fetcher = Fetcher(scratch / "stream-cache", Commands(), keyring=keyring)

    def download() -> None:
        with fetcher.stream(url) as stream:
            while stream.read(1 << 20):
                pass

    def extract() -> None:
        destination = scratch / f"tree-{time.monotonic_ns()}"
        with fetcher.stream(url) as stream:
            extract_container_tree(stream, destination, None)
        shutil.rmtree(destination)

    return timed(download), timed(extract)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bandwidth-mb",
        type=float,
        default=50.0,
        help="release-server bandwidth for the streaming figure, in MB/s",
    )
    args = parser.parse_args()
    artifacts = build_release_artifacts(TEST_RELEASE, kernel_tree(TEST_RELEASE.kernel))
    with tempfile.TemporaryDirectory(prefix="gdc-bench-") as name:
        scratch = Path(name)
        key = generate_signing_key(scratch / "key")
        server = FlatcarReleaseServer(
            artifacts, sign_release(artifacts, key, scratch / "sigs"), key
        )
        try:
            root = driver_root(scratch)
            cache = scratch / "cache"
            build = build_command(root, cache, server, key.public_keyring)
            cold = timed(build)  # downloads, extracts and compiles
            [tree] = (cache / "trees").glob("*/usr/lib/modules/*/build")
            shutil.rmtree(cache / "packages")
            runtime = timed(build)  # the tree is cached: what is left is the build itself
            bare = timed(bare_make(root, tree, scratch))
            warm = timed(build)
            server.throttle(args.bandwidth_mb * 1e6)
            download, extract = stream_ratio(server, key.public_keyring, scratch)
            server.throttle(None)
            loop_download, loop_extract = stream_ratio(server, key.public_keyring, scratch)
        finally:
            server.close()
            key.close()
    tarball_mb = artifacts.path(CONTAINER_TARBALL).stat().st_size / 1e6
    print(f"cold build (download + extract + compile): {cold:7.1f} s")
    print(f"runtime build, tree cached:                {runtime:7.1f} s")
    print(f"bare make modules, same sources and tree:  {bare:7.1f} s")
    print(f"  ratio runtime build / bare make:         {runtime / bare:7.2f}"
          f"   (goal <= {RUNTIME_BUILD_GOAL})")  # fmt: skip
    print(f"warm-cache rebuild:                        {warm:7.2f} s"
          f"   (goal <= {WARM_GOAL_SECONDS:g} s, no compile)")  # fmt: skip
    print(f"{CONTAINER_TARBALL} ({tarball_mb:.0f} MB) at {args.bandwidth_mb:g} MB/s:")
    print(f"  download only: {download:6.2f} s, streamed extract: {extract:6.2f} s, "
          f"ratio {extract / download:.2f}   (goal <= {STREAM_GOAL})")  # fmt: skip
    print(f"  over raw loopback: download {loop_download:6.2f} s, extract {loop_extract:6.2f} s, "
          f"ratio {loop_extract / loop_download:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
