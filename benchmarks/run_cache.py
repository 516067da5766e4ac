"""What a runtime build puts in /run, which is RAM on Flatcar, in one run (needs root).

A runtime build (``nvidia-driver build`` for the running node: what ``init`` does when no
package matches) is run on a simulated node made from the integration fixtures: Debian's
6.12.95 kernel shaped as Flatcar's, NVIDIA 535.261.03 from the fixture .run, open modules. The
cache (``NVIDIA_DRIVER_CACHE_DIR``, ``/run/nvidia/cache`` on a node) is sampled every 50 ms
while the build runs. Printed, as ratios to the size of the package the build makes: the most
bytes the cache held at any time (goal: <= 1.5) and what it holds after the build; for the
record, the same for the work directory (``NVIDIA_DRIVER_WORK_DIR``, on the container's disk).

Two cases: the node's own tree (every release from 4230.1.0 and LTS 4081 ship one), and a node
without one, whose release's flatcar-container.tar.gz is streamed from a release server on
127.0.0.1.

Usage: python benchmarks/run_cache.py [--only host|tarball] [--record]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
# From a fresh checkout: this checkout's entrypoint, here and in the commands it starts.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [sys.path[0], *filter(None, [os.environ.get("PYTHONPATH")])]
)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.gpg import generate_signing_key
from fixtures.kernel import KernelTree, kernel_tree
from fixtures.release_server import HOST_GCC_RELEASE, build_release_artifacts, sign_release
from record import Report, add_record_option
from release_build import DRIVER, ServerProcess, driver_root

from nvidia_driver.commands import Commands
from nvidia_driver.formats.vmlinuz import kernel_banner_from_file

PEAK_GOAL = 1.5
SAMPLE_SECONDS = 0.05


def tree_bytes(top: Path) -> int:
    """Bytes the files under top take (what a tmpfs holds for them)."""
    total = 0
    for directory, _, files in os.walk(top):
        for name in files:
            try:
                status = os.lstat(os.path.join(directory, name))  # noqa: PTH118 - os.walk's str
            except OSError:  # removed while walking
                continue
            total += status.st_blocks * 512
    return total


class Sampler:
    """The peak of tree_bytes(top), sampled in a thread until stop()."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, tree_bytes(self.top))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_bytes(self.top))
        return self.peak


def simulated_node(scratch: Path, tree: KernelTree, *, with_host_tree: bool) -> Path:
    """A node root: the driver's sources (as in the image), /proc facts, the host's root."""
    root = driver_root(scratch)
    banner = kernel_banner_from_file(tree.vmlinuz, commands=Commands())
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/version").write_text(banner + "\n")
    (root / "proc/sys/kernel/osrelease").write_text(tree.kernel.release + "\n")
    (root / "host-etc").mkdir()
    (root / "host-etc/os-release").write_text(HOST_GCC_RELEASE.os_release())
    host = root / "proc/1/root"
    if with_host_tree:  # hard links: the node's /usr/lib/modules and /usr/lib64, no copy
        host.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", tree.rootfs, host], check=True)
    else:
        host.mkdir(parents=True)
    return root


@dataclass(frozen=True)
class Figures:
    package: int
    cache_peak: int
    cache_left: int
    work_peak: int
    work_left: int


def measure(root: Path, scratch: Path, env: dict[str, str]) -> Figures:
    cache, work = scratch / "run-nvidia-cache", scratch / "work"
    env = {
        **os.environ,
        "NVIDIA_DRIVER_HOST_ROOT": str(root),
        "NVIDIA_DRIVER_CACHE_DIR": str(cache),
        "NVIDIA_DRIVER_WORK_DIR": str(work),
        "DRIVER_VERSION": DRIVER,
        "TARGETARCH": "amd64",
        **env,
    }
    cache.mkdir()
    work.mkdir()
    in_cache, in_work = Sampler(cache), Sampler(work)
    subprocess.run(
        [sys.executable, "-m", "nvidia_driver", "build", "--module-type", "open"],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    cache_peak, work_peak = in_cache.stop(), in_work.stop()
    [package] = (cache / "packages").glob("*/*/*/metadata.json")
    return Figures(
        package=tree_bytes(package.parent),
        cache_peak=cache_peak,
        cache_left=tree_bytes(cache),
        work_peak=work_peak,
        work_left=tree_bytes(work),
    )


def report(case: str, figures: Figures) -> None:
    mb = 1e6
    package = figures.package
    print(f"{case}: package {package / mb:.1f} MB")
    print(
        f"  /run cache: peak {figures.cache_peak / mb:7.1f} MB = "
        f"{figures.cache_peak / package:.2f} x the package (goal <= {PEAK_GOAL}), "
        f"left {figures.cache_left / mb:.1f} MB = {figures.cache_left / package:.2f} x"
    )
    print(f"  work dir (disk): peak {figures.work_peak / mb:7.1f} MB = "
          f"{figures.work_peak / package:.1f} x, left {figures.work_left / mb:.1f} MB")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["host", "tarball"], help="measure one case only")
    add_record_option(parser)
    args = parser.parse_args()
    tree = kernel_tree(HOST_GCC_RELEASE.kernel)
    results: list[tuple[str, Figures]] = []
    with tempfile.TemporaryDirectory(prefix="gdc-bench-run-") as name:
        scratch = Path(name)
        if args.only != "tarball":
            case = scratch / "host"
            case.mkdir()
            root = simulated_node(case, tree, with_host_tree=True)
            results.append(("node's own tree", measure(root, case, {})))
        if args.only != "host":
            case = scratch / "tarball"
            case.mkdir()
            artifacts = build_release_artifacts(HOST_GCC_RELEASE, tree)
            key = generate_signing_key(case / "key")
            server = ServerProcess(artifacts, sign_release(artifacts, key, case / "sigs"), key)
            try:
                root = simulated_node(case, tree, with_host_tree=False)
                env = {
                    "FLATCAR_RELEASE_BASE_URL": server.base_url,
                    "FLATCAR_KEYRING": str(key.public_keyring),
                }
                results.append(("flatcar-container.tar.gz streamed", measure(root, case, env)))
            finally:
                server.close()
                key.close()
    with Report("run_cache", record=args.record):
        for case_name, figures in results:
            report(case_name, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
