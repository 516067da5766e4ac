"""What a precompiled image costs at node start and in the registry, in one run (needs root).

It prints:

1. ``nvidia-driver init`` of the precompiled image, run as the GPU Operator's DaemonSet runs it
   on a simulated HGX H100 node whose kernel matches the image's packages (the integration
   tests' harness, fixtures/daemonset.py: only module loading and the GPU are stubbed), from
   container start to "Done, now waiting for signal": the median of N runs (goal <= 2 s);
2. the bytes the precompiled image adds over its build image (its one extra layer) divided by
   the size of the packages it carries, /opt/nvidia/precompiled (goal <= 1.2).

Without ``--build-image`` and ``--precompiled-image`` both images are built first, as the
integration tests build them (fixtures/images.py: loopback NVIDIA and Flatcar servers, the
535.261.03 fixture driver, the 9999.2.0 test release), which takes a while.

Usage: python benchmarks/precompiled_image.py [--build-image REF --precompiled-image REF]
       [--runs N] [--record]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from fixtures.daemonset import (
    HGX_H100,
    READY_LINE,
    Node,
    docker,
    driver_pod,
    image_packages,
)
from fixtures.docker_env import start_dockerd, stop_dockerd
from fixtures.images import built_images
from fixtures.release_server import TEST_RELEASE
from image_sizes import image_arguments, image_parser
from record import Report

INIT_GOAL_SECONDS = 2.0
SIZE_GOAL = 1.2


def init_seconds(image: str, node: Node) -> tuple[float, float]:
    """One init: (container start to the ready line, ``docker run`` to the ready line)."""
    started = time.monotonic()
    with driver_pod(image, node) as pod:
        ready = pod.wait_for(READY_LINE)
        wall = time.monotonic() - started
        from_start = ready - pod.started_at()
        if pod.stop() != 0:
            raise RuntimeError(f"init did not stop cleanly:\n{pod.output}")
    return from_start, wall


def image_bytes(reference: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", reference).stdout)


def layers(reference: str) -> list[str]:
    listed = docker("image", "inspect", "--format", "{{range .RootFS.Layers}}{{.}} {{end}}",
                    reference).stdout  # fmt: skip
    return listed.split()


def package_bytes(reference: str) -> int:
    listed = docker("run", "--rm", "--network", "none", "--entrypoint", "du", reference,
                    "-sb", "/opt/nvidia/precompiled").stdout  # fmt: skip
    return int(listed.split()[0])


@contextmanager
def images(build: str | None, precompiled: str | None) -> Iterator[tuple[str, str]]:
    """The references given, on the project's dockerd; else both built for this run."""
    with ExitStack() as stack:
        if build and precompiled:
            stack.callback(stop_dockerd, start_dockerd())
            yield build, precompiled
            return
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gdc-bench-")))
        print("building the build and precompiled images (this takes a while)...", flush=True)
        built = stack.enter_context(built_images(scratch))
        yield built.build, built.precompiled


def main() -> int:
    parser = image_parser(__doc__)
    parser.add_argument("--runs", type=int, default=7, help="init runs to take the median of")
    args = image_arguments(parser)
    with images(args.build_image, args.precompiled_image) as (build, precompiled):
        if layers(precompiled)[:-1] != layers(build):
            parser.error(f"{precompiled} is not one layer on {build}")
        [banner] = {str(package["banner"]) for package in image_packages(precompiled)}
        node = Node(banner, TEST_RELEASE.kernel.release, TEST_RELEASE.os_release(), HGX_H100)
        init_seconds(precompiled, node)  # warm-up: the image's files into the page cache
        samples = [init_seconds(precompiled, node) for _ in range(args.runs)]
        added = image_bytes(precompiled) - image_bytes(build)
        packages = package_bytes(precompiled)
    starts = [sample[0] for sample in samples]
    from_start = statistics.median(starts)
    wall = statistics.median(sample[1] for sample in samples)
    ratio = added / packages
    met = from_start <= INIT_GOAL_SECONDS and ratio <= SIZE_GOAL
    with Report("precompiled_image", record=args.record):
        print_figures(args.runs, starts, wall, added, packages)
        print(f"goals: {'met' if met else 'missed'}")
    return 0 if met else 1


def print_figures(runs: int, starts: list[float], wall: float, added: int, packages: int) -> None:
    from_start = statistics.median(starts)
    ratio = added / packages
    print(f"precompiled init, container start to {READY_LINE!r}:")
    print(f"  median of {runs}: {from_start:6.2f} s   (goal <= {INIT_GOAL_SECONDS:g} s)"
          f"   [min {min(starts):.2f}, max {max(starts):.2f}]")  # fmt: skip
    print(f"  from `docker run` (container creation included): {wall:6.2f} s")
    print(f"bytes the precompiled image adds over the build image: {added:>11,} "
          f"({added / 1e6:.1f} MB)")  # fmt: skip
    print(f"packages in it (du -sb /opt/nvidia/precompiled):      {packages:>11,} "
          f"({packages / 1e6:.1f} MB)")  # fmt: skip
    print(f"  ratio added / packages: {ratio:.4f}   (goal <= {SIZE_GOAL})")


if __name__ == "__main__":
    sys.exit(main())
