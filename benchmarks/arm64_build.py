"""The arm64 package build over the amd64 one, on this amd64 machine, in one run (needs root).

Both are ``nvidia-driver build --module-type open`` of NVIDIA 550.163.01's open modules for a
simulated node, in the same Debian trixie root (tests/integration/fixtures/cross_build.py), on
Debian trixie's 6.12.117 cloud kernel built by gcc 14: the amd64 kernel with the root's native
gcc-14, the arm64 one cross-compiled with aarch64-linux-gnu-gcc-14 (the same gcc 14.2.0, as the
precompiled arm64 image is built on an amd64 runner: never under emulation). Neither is cached;
the root, trees and sources are prepared first and not counted. The builds alternate,
``--runs`` times each, and the medians are compared.

Usage: python benchmarks/arm64_build.py [--runs 1] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
# From a fresh checkout: this checkout's entrypoint (the build itself runs the copy that
# fixtures/cross_build.py puts into its root).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))

from fixtures.cross_build import build_uncached, cross_root, open_sources
from fixtures.kernel import TRIXIE_ARM64_KERNEL, TRIXIE_KERNEL, kernel_tree
from record import Report, add_record_option

from nvidia_driver.formats.vmlinuz import kernel_banner_from_file

DRIVER = "550.163.01"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1, help="builds of each arch (default 1)")
    add_record_option(parser)
    args = parser.parse_args()
    cross_root()
    trees = {"amd64": kernel_tree(TRIXIE_KERNEL), "arm64": kernel_tree(TRIXIE_ARM64_KERNEL)}
    banners = {arch: kernel_banner_from_file(tree.vmlinuz) for arch, tree in trees.items()}
    for arch in trees:
        open_sources(DRIVER, arch)
    seconds: dict[str, list[float]] = {arch: [] for arch in trees}
    with Report("arm64_build", record=args.record):
        for run in range(args.runs):
            for arch, tree in trees.items():
                with tempfile.TemporaryDirectory(prefix=f"gdc-bench-{arch}-") as scratch:
                    took = build_uncached(Path(scratch), tree, banners[arch], DRIVER)
                seconds[arch].append(took)
                print(f"run {run + 1}: {arch} package built in {took:.1f} s", flush=True)
        amd64, arm64 = (statistics.median(seconds[arch]) for arch in ("amd64", "arm64"))
        print(f"amd64 (native gcc-14): {amd64:.1f} s; "
              f"arm64 (aarch64-linux-gnu-gcc-14): {arm64:.1f} s")  # fmt: skip
        print(f"arm64 / amd64 package build time: {arm64 / amd64:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
