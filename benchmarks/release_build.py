"""The runtime build, side by side with what it cannot avoid, in one run (needs root).

Against the integration fixtures (a Flatcar release server on 127.0.0.1 serving Debian's
6.12.95 kernel, and NVIDIA 535.261.03 from a fixture .run), it prints:

1. the runtime build (``nvidia-driver build --flatcar-version``, the code init runs when no
   package matches) divided by a bare ``make modules`` of the same sources on the same tree;
2. a rebuild with a warm cache (goal: no compile, at most 3 s);
3. streaming flatcar-container.tar.gz into the tree extractor divided by only downloading it,
   both verified, at a mirror-like bandwidth (and, for the record, over raw loopback).

The release server runs in a process of its own, as a mirror is far away: serving must not take
the measured process's CPU or GIL. The tree is extracted under --scratch, by default the
system's temporary directory: on a node the tree goes to the work directory, on the container's
disk (see entrypoint/src/nvidia_driver/cachedirs.py).

Usage: python benchmarks/release_build.py [--bandwidth-mb 50] [--only build|stream] [--scratch DIR]
       [--record]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
# From a fresh checkout: this checkout's entrypoint, here and in the commands it starts.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [sys.path[0], *filter(None, [os.environ.get("PYTHONPATH")])]
)

from fixtures.gpg import SigningKey, generate_signing_key
from fixtures.kernel import kernel_tree
from fixtures.release_server import (
    CONTAINER_TARBALL,
    HOST_GCC_RELEASE,
    FlatcarReleaseServer,
    ReleaseArtifacts,
    Signatures,
    build_release_artifacts,
    sign_release,
)
from fixtures.runfile import build_run_fixture
from record import Report, add_record_option

from nvidia_driver.commands import Commands
from nvidia_driver.kbuild.container import extract_container_tree
from nvidia_driver.sources.fetch import Fetcher
from nvidia_driver.sources.verify import Trust

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


class ServerProcess:
    """The release server in a child process; throttle() and close() are sent over a pipe."""

    def __init__(
        self, artifacts: ReleaseArtifacts, signatures: Signatures, key: SigningKey
    ) -> None:
        context = multiprocessing.get_context("fork")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, artifacts, signatures, key), daemon=True
        )
        self._process.start()
        self.base_url, self.tarball_url = self._pipe.recv()

    def throttle(self, bytes_per_second: float | None) -> None:
        self._pipe.send(bytes_per_second)
        self._pipe.recv()

    def close(self) -> None:
        self._pipe.send("close")
        self._process.join()


def _serve(
    pipe: Connection, artifacts: ReleaseArtifacts, signatures: Signatures, key: SigningKey
) -> None:
    server = FlatcarReleaseServer(artifacts, signatures, key)
    try:
        pipe.send((server.base_url, server.artifact_url(CONTAINER_TARBALL)))
        while (command := pipe.recv()) != "close":
            server.throttle(command)
            pipe.send(None)
    finally:
        server.close()


def build_command(
    root: Path, cache: Path, server: ServerProcess, keyring: Path
) -> Callable[[], None]:
    env = {
        **os.environ,
        "NVIDIA_DRIVER_HOST_ROOT": str(root),
        "NVIDIA_DRIVER_CACHE_DIR": str(cache),
        "NVIDIA_DRIVER_WORK_DIR": str(work_of(cache)),
        "FLATCAR_RELEASE_BASE_URL": server.base_url,
        "FLATCAR_KEYRING": str(keyring),
        "DRIVER_VERSION": DRIVER,
        "TARGETARCH": "amd64",
    }
    argv = [sys.executable, "-m", "nvidia_driver", "build", "--flatcar-version",
            HOST_GCC_RELEASE.version, "--module-type", "open"]  # fmt: skip

    def run() -> None:
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)

    return run


def work_of(cache: Path) -> Path:
    return cache.with_name(f"{cache.name}-work")


def bare_make(root: Path, tree: Path, scratch: Path) -> Callable[[], None]:
    sources = scratch / "bare"
    shutil.copytree(root / "usr/src" / f"nvidia-{DRIVER}" / "kernel-open", sources, symlinks=True)
    argv = ["make", "-C", str(sources), f"-j{os.cpu_count()}", "modules",
            f"SYSSRC={tree}", f"SYSOUT={tree}", "CC=gcc-12", "IGNORE_CC_MISMATCH=1"]  # fmt: skip

    def run() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    return run


@dataclass(frozen=True)
class StreamTimes:
    download: float
    extract: float

    @property
    def ratio(self) -> float:
        return self.extract / self.download


def stream_ratio(url: str, keyring: Path, scratch: Path) -> StreamTimes:
    fetcher = Fetcher(scratch / "stream-cache", Commands(), Trust.of_keyring(keyring))

    def download() -> None:
        with fetcher.stream(url) as stream:
            while stream.read(1 << 20):
                pass

    destination = scratch / f"tree-{time.monotonic_ns()}"

    def extract() -> None:
        extract_container_tree(fetcher.stream(url), destination, None)

    downloaded = timed(download)
    extracted = timed(extract)
    shutil.rmtree(destination)
    return StreamTimes(downloaded, extracted)


def build_figures(
    server: ServerProcess, keyring: Path, scratch: Path
) -> tuple[float, float, float, float]:
    """Cold build, runtime build with the tree cached, bare make, warm rebuild (seconds)."""
    root = driver_root(scratch)
    cache = scratch / "cache"
    build = build_command(root, cache, server, keyring)
    cold = timed(build)  # downloads, extracts and compiles
    [tree] = (work_of(cache) / "trees").glob("*/usr/lib/modules/*/build")
    shutil.rmtree(cache / "packages")
    runtime = timed(build)  # the tree is cached: what is left is the build itself
    bare = timed(bare_make(root, tree, scratch))
    warm = timed(build)
    return cold, runtime, bare, warm


def default_scratch() -> Path:
    return Path(tempfile.gettempdir())


def print_build_figures(cold: float, runtime: float, bare: float, warm: float) -> None:
    print(f"cold build (download + extract + compile): {cold:7.1f} s")
    print(f"runtime build, tree cached:                {runtime:7.1f} s")
    print(f"bare make modules, same sources and tree:  {bare:7.1f} s")
    print(f"  ratio runtime build / bare make:         {runtime / bare:7.2f}"
          f"   (goal <= {RUNTIME_BUILD_GOAL})")  # fmt: skip
    print(f"warm-cache rebuild:                        {warm:7.2f} s"
          f"   (goal <= {WARM_GOAL_SECONDS:g} s, no compile)")  # fmt: skip


def print_stream_figures(
    tarball: Path, bandwidth_mb: float, scratch: Path, throttled: StreamTimes, loop: StreamTimes
) -> None:
    size_mb = tarball.stat().st_size / 1e6
    where = f"extracted in {scratch}"
    print(f"{CONTAINER_TARBALL} ({size_mb:.0f} MB) at {bandwidth_mb:g} MB/s, {where}:")
    print(f"  download only: {throttled.download:6.2f} s, streamed extract: "
          f"{throttled.extract:6.2f} s, ratio {throttled.ratio:.2f}"
          f"   (goal <= {STREAM_GOAL})")  # fmt: skip
    print(f"  over raw loopback: download {loop.download:6.2f} s, extract {loop.extract:6.2f} s, "
          f"ratio {loop.ratio:.2f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bandwidth-mb",
        type=float,
        default=50.0,
        help="release-server bandwidth for the streaming figure, in MB/s",
    )
    parser.add_argument(
        "--only",
        choices=["build", "stream"],
        help="measure only the builds (figures 1 and 2) or only the streaming (figure 3)",
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=default_scratch(),
        help="where the streamed tree is extracted (default: the temporary directory, on disk "
        "like the work directory of a node's driver container)",
    )
    add_record_option(parser)
    args = parser.parse_args()
    artifacts = build_release_artifacts(HOST_GCC_RELEASE, kernel_tree(HOST_GCC_RELEASE.kernel))
    builds: tuple[float, float, float, float] | None = None
    streams: tuple[StreamTimes, StreamTimes] | None = None
    with (
        tempfile.TemporaryDirectory(prefix="gdc-bench-") as name,
        tempfile.TemporaryDirectory(prefix="gdc-bench-stream-", dir=args.scratch) as stream_name,
    ):
        scratch = Path(name)
        key = generate_signing_key(scratch / "key")
        server = ServerProcess(artifacts, sign_release(artifacts, key, scratch / "sigs"), key)
        try:
            if args.only != "stream":
                builds = build_figures(server, key.public_keyring, scratch)
            if args.only != "build":
                url, keyring = server.tarball_url, key.public_keyring
                server.throttle(args.bandwidth_mb * 1e6)
                throttled = stream_ratio(url, keyring, Path(stream_name))
                server.throttle(None)
                streams = (throttled, stream_ratio(url, keyring, Path(stream_name)))
        finally:
            server.close()
            key.close()
    with Report("release_build", record=args.record):
        if builds is not None:
            print_build_figures(*builds)
        if streams is not None:
            print_stream_figures(
                artifacts.path(CONTAINER_TARBALL), args.bandwidth_mb, args.scratch, *streams
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
