"""What a node pulls: the images' compressed layers as the registry stores them (needs root).

For the build image and the precompiled image it prints, side by side for the layers as
dockerd pushes them (gzip) and as ``invoke publish`` publishes them (zstd, gdc.compression):

1. each layer's compressed size, read from the registry's manifest, its uncompressed size and
   the step of the Dockerfile that made it;
2. the total a fresh node pulls;
3. the update pull: what a node that holds the precompiled image of release N pulls for
   release N+1. Both are their build image's layers plus one packages layer of their own
   (test_images.py; the build image is one per driver, not per release), so a node pulls the
   layers of the precompiled image that its build image lacks, compared by digest: for zstd
   this also proves that recompressing the build image and the precompiled image apart gives
   the shared layers the same digests (a node would otherwise pull them again);
4. pull plus extract at LINK_BITS_PER_SECOND: the bytes over the link, plus each layer's
   decompression measured here on one core (``gzip -dc`` / ``zstd -dc -T1``, output discarded),
   with no overlap between the two (containerd fetches a layer, then unpacks it);
5. the largest packages of the build image, by the bytes of their files in it (beside dpkg's
   declared Installed-Size), and the largest files of the update's layers (zstd), unpacked:
   where the remaining bytes are.

Without ``--build-image`` and ``--precompiled-image`` (references on the project's dockerd,
unix:///run/gdc-docker.sock) the images are built first, as the integration tests build them
(fixtures/images.py: the 535.261.03 fixture driver, the test release 9999.2.0), which takes a
while. The images are pushed
to a local registry (Debian's docker-registry on 127.0.0.1), then recompressed there.

Usage (root; the venv of ``nox -s integration``, which has requests and invoke):
  .nox/integration/bin/python benchmarks/image_sizes.py [--build-image REF
      --precompiled-image REF] [--zstd-level N] [--record]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

# From a fresh checkout, in the venv `nox -s integration` made (requests, invoke): the fixtures,
# what they share with the unit tests, the tooling and this checkout's entrypoint.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tooling"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests" / "shared"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from fixtures.daemonset import docker
from fixtures.docker_env import Registry, local_registry, start_dockerd, stop_dockerd
from fixtures.images import built_images
from record import Report, add_record_option

from gdc.compression import recompress
from gdc.registry import Registry as RegistryClient

LINK_BITS_PER_SECOND = 1e9
MB = 1e6
# Issue 39's pulls (a fresh node's, and the update's per release: issue 24 had 650 and 60 MB),
# and issue 24's pull time and build image size.
PRECOMPILED_PULL_GOAL = 480 * MB
PULL_SECONDS_GOAL = 12.0
UPDATE_PULL_GOAL = 15 * MB
BUILD_IMAGE_GOAL = 1.4e9
TOP_PACKAGES = 12
TOP_FILES = 8
_DECOMPRESS = {"gzip": ["gzip", "-dc"], "zstd": ["zstd", "-dc", "-T1"]}


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int  # compressed, as the manifest says
    uncompressed: int
    decompress_seconds: float  # on one core
    step: str  # the Dockerfile step (image history) that made it


@dataclass(frozen=True)
class Pushed:
    """One image in the registry, in one compression."""

    reference: str
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def uncompressed(self) -> int:
        return sum(layer.uncompressed for layer in self.layers)

    def pull_seconds(self, layers: tuple[Layer, ...] | None = None) -> float:
        chosen = self.layers if layers is None else layers
        return sum(layer.size * 8 / LINK_BITS_PER_SECOND + layer.decompress_seconds
                   for layer in chosen)  # fmt: skip

    def new_over(self, held: Pushed) -> tuple[Layer, ...]:
        """The layers a node holding held pulls for this image."""
        have = {layer.digest for layer in held.layers}
        return tuple(layer for layer in self.layers if layer.digest not in have)


def _decompress(kind: str, blob: Path) -> tuple[int, float]:
    """(uncompressed bytes, seconds of one core)."""
    command = _DECOMPRESS[kind]
    started = time.monotonic()
    with blob.open("rb") as source:
        process = subprocess.Popen([*command], stdin=source, stdout=subprocess.PIPE)
        assert process.stdout is not None
        total = 0
        while chunk := process.stdout.read(1 << 20):
            total += len(chunk)
    if process.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} failed on {blob}")
    return total, time.monotonic() - started


def _steps(config: dict[str, object]) -> list[str]:
    """Each layer's Dockerfile step, shortened: the history entries that made a layer."""
    history = config.get("history", [])
    assert isinstance(history, list)
    steps = []
    for entry in history:
        if entry.get("empty_layer"):
            continue
        step = " ".join(str(entry.get("created_by", "")).split())
        step = step.removeprefix("/bin/sh -c ").removeprefix("#(nop) ")
        steps.append(step[:60])
    return steps


def read_pushed(registry: Registry, name: str, tag: str, scratch: Path) -> Pushed:
    client = RegistryClient(registry.address)
    manifest = client.manifest(name, tag)
    steps = _steps(client.config(name, manifest))
    layers = []
    for index, descriptor in enumerate(manifest.json()["layers"]):
        kind = "zstd" if descriptor["mediaType"].endswith("zstd") else "gzip"
        blob = scratch / "blob"
        client.fetch_blob(name, descriptor["digest"], int(descriptor["size"]), blob)
        uncompressed, seconds = _decompress(kind, blob)
        blob.unlink()
        step = steps[index] if index < len(steps) else "?"
        layers.append(Layer(descriptor["digest"], int(descriptor["size"]), uncompressed,
                            seconds, step))  # fmt: skip
    return Pushed(f"{registry.address}/{name}:{tag}", tuple(layers))


def largest_files(
    registry: Registry, name: str, layers: tuple[Layer, ...], scratch: Path
) -> list[tuple[int, str]]:
    """The largest regular files of zstd layers, unpacked: (bytes, path)."""
    client = RegistryClient(registry.address)
    files = []
    for layer in layers:
        blob = scratch / "blob"
        client.fetch_blob(name, layer.digest, layer.size, blob)
        with blob.open("rb") as source:
            process = subprocess.Popen(_DECOMPRESS["zstd"], stdin=source, stdout=subprocess.PIPE)
            with tarfile.open(fileobj=process.stdout, mode="r|") as tar:
                files += [(member.size, f"/{member.name}") for member in tar if member.isfile()]
        if process.wait() != 0:
            raise RuntimeError(f"zstd failed on layer {layer.digest}")
        blob.unlink()
    return sorted(files, reverse=True)[:TOP_FILES]


# Run in the image: each package's bytes as the image holds them, from the files dpkg lists for
# it (regular files, each inode once: /lib is /usr/lib). dpkg's Installed-Size is what the
# package declares, before the image's path-excludes (images/build/dpkg/gdc-slim) took lto1,
# the sanitizers' runtimes, docs and translations out of it.
_ON_DISK = """
import glob, os, stat
seen = set()
for listing in sorted(glob.glob("/var/lib/dpkg/info/*.list")):
    total = 0
    with open(listing) as paths:
        for path in paths.read().splitlines():
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    print(f"{total}\t{os.path.basename(listing)[:-5].split(':')[0]}")
"""


def top_packages(reference: str) -> list[tuple[int, int, str]]:
    """The largest packages of the image: (bytes on disk, dpkg's Installed-Size, name)."""
    declared: dict[str, int] = {}
    listed = docker("run", "--rm", "--network", "none", "--entrypoint", "dpkg-query", reference,
                    "-W", "-f", "${Installed-Size}\t${Package}\n").stdout  # fmt: skip
    for line in listed.splitlines():
        kib, _, package = line.partition("\t")
        declared[package] = int(kib or 0) * 1024
    on_disk = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", reference,
                     "-c", _ON_DISK).stdout  # fmt: skip
    sizes = []
    for line in on_disk.splitlines():
        size, _, package = line.partition("\t")
        sizes.append((int(size), declared.get(package, 0), package))
    return sorted(sizes, reverse=True)[:TOP_PACKAGES]


def image_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's arguments: --build-image and --precompiled-image (images already built,
    else the benchmark builds them: fixtures/images.py) and --record, then its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--build-image", help="the build image (a reference on the project's "
                        "dockerd, unix:///run/gdc-docker.sock)")  # fmt: skip
    parser.add_argument("--precompiled-image", help="the precompiled image built on it")
    add_record_option(parser)
    return parser


def image_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """image_parser's arguments, parsed: both images given, or neither."""
    args = parser.parse_args()
    if bool(args.build_image) != bool(args.precompiled_image):
        parser.error("give both --build-image and --precompiled-image, or neither")
    return args


@contextmanager
def images(args: argparse.Namespace) -> Iterator[tuple[str, str, Registry]]:
    """The two images (build, precompiled) and a registry to push to."""
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gdc-sizes-")))
        if args.build_image:
            stack.callback(stop_dockerd, start_dockerd())
            (scratch / "registry").mkdir()
            registry = stack.enter_context(local_registry(scratch / "registry"))
            yield args.build_image, args.precompiled_image, registry
            return
        print("building the build and precompiled images (this takes a while)...", flush=True)
        built = stack.enter_context(built_images(scratch))
        yield built.build, built.precompiled, built.registry


def push(reference: str, registry: Registry, name: str, tag: str) -> None:
    target = f"{registry.address}/{name}:{tag}"
    if target != reference:
        docker("tag", reference, target)
    docker("push", target, timeout=1800)


def main() -> int:
    parser = image_parser(__doc__)
    parser.add_argument("--zstd-level", type=int, default=19, help="zstd level (publish's)")
    args = image_arguments(parser)
    name = "gdc/sizes"
    tags = {"build": "build", "precompiled": "precompiled"}
    pushed: dict[tuple[str, str], Pushed] = {}
    with ExitStack() as stack:
        build, precompiled, registry = stack.enter_context(images(args))
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gdc-blobs-")))
        client = RegistryClient(registry.address)
        for key, reference in zip(tags, (build, precompiled), strict=True):
            push(reference, registry, name, tags[key])
            pushed[(key, "gzip")] = read_pushed(registry, name, tags[key], scratch)
            recompress(client, name, tags[key], level=args.zstd_level, tag=f"{tags[key]}-zstd")
            pushed[(key, "zstd")] = read_pushed(registry, name, f"{tags[key]}-zstd", scratch)
        update = pushed[("precompiled", "zstd")].new_over(pushed[("build", "zstd")])
        files = largest_files(registry, name, update, scratch)
        packages = top_packages(build)
    with Report("image_sizes", record=args.record):
        met = print_figures(pushed, packages, files, args.zstd_level)
        print(f"goals: {'met' if met else 'missed'}")
    return 0 if met else 1


def _mb(count: float) -> str:
    return f"{count / MB:8.1f} MB"


def print_figures(pushed: dict[tuple[str, str], Pushed], packages: list[tuple[int, int, str]],
                  files: list[tuple[int, str]], level: int) -> bool:  # fmt: skip
    print(f"layers as dockerd pushes them (gzip) and as invoke publish does (zstd -{level}):")
    for key in ("build", "precompiled"):
        gzip, zstd = pushed[(key, "gzip")], pushed[(key, "zstd")]
        print(f"{key} image: {gzip.uncompressed / MB:.1f} MB uncompressed")
        print(f"  {'gzip':>11} {'zstd':>11} {'unpacked':>11}  step")
        for g, z in zip(gzip.layers, zstd.layers, strict=True):
            print(f"  {_mb(g.size)} {_mb(z.size)} {_mb(g.uncompressed)}  {g.step}")
        print(f"  {_mb(gzip.size)} {_mb(zstd.size)}  a fresh node's pull; zstd / gzip "
              f"{zstd.size / gzip.size:.3f}")  # fmt: skip
    rate = LINK_BITS_PER_SECOND / 1e9
    print(f"pull + extract at {rate:g} Gbit/s (bytes over the link, then decompression on one "
          "core, measured here):")  # fmt: skip
    for key in ("build", "precompiled"):
        gzip, zstd = pushed[(key, "gzip")], pushed[(key, "zstd")]
        print(f"  {key:>11}: gzip {gzip.pull_seconds():6.1f} s, zstd {zstd.pull_seconds():6.1f} s"
              f"; zstd / gzip {zstd.pull_seconds() / gzip.pull_seconds():.3f}")  # fmt: skip
    print("update: a node holding release N's precompiled image pulls for N+1 the layers its "
          "build image lacks:")  # fmt: skip
    updates = {}
    for kind in ("gzip", "zstd"):
        image = pushed[("precompiled", kind)]
        new = image.new_over(pushed[("build", kind)])
        updates[kind] = sum(layer.size for layer in new)
        shared = len(image.layers) - len(new)
        print(f"  {kind}: {len(new)} layer(s) of {len(image.layers)}, {_mb(updates[kind]).strip()},"
              f" {image.pull_seconds(new):.1f} s; {shared} shared with the build image by "
              "digest")  # fmt: skip
    print(f"largest files of the update (top {len(files)}, unpacked):")
    for size, path in files:
        print(f"  {_mb(size)}  {path}")
    print(f"largest packages of the build image (top {len(packages)}: on disk, and as dpkg's "
          "Installed-Size declares before the image's path-excludes):")  # fmt: skip
    for size, declared, package in packages:
        print(f"  {_mb(size)} {_mb(declared)}  {package}")
    zstd = pushed[("precompiled", "zstd")]
    build = pushed[("build", "gzip")]
    checks = [
        ("precompiled fresh pull (zstd)", zstd.size, PRECOMPILED_PULL_GOAL, _mb),
        ("precompiled pull + extract (zstd)", zstd.pull_seconds(), PULL_SECONDS_GOAL,
         lambda s: f"{s:.1f} s"),
        ("update pull (zstd)", updates["zstd"], UPDATE_PULL_GOAL, _mb),
        ("build image uncompressed", build.uncompressed, BUILD_IMAGE_GOAL, _mb),
    ]  # fmt: skip
    met = True
    for what, value, goal, shown in checks:
        ok = value <= goal
        met = met and ok
        print(f"goal {what}: {shown(value).strip()} <= {shown(goal).strip()}: "
              f"{'meets' if ok else 'misses'} (ratio {value / goal:.2f})")  # fmt: skip
    return met


if __name__ == "__main__":
    sys.exit(main())
