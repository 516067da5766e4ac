"""The project's tar reader (formats/tar.py: tarfile, bounded) beside plain tarfile.

Usage: python benchmarks/tar_reader.py [--runs N] [--record]
Builds two archives from trees on this machine, in the layouts the extraction reads, and
extracts each as the entrypoint does, through the same member checks and TreeWriter, with two
readers: formats.tar as the entrypoint opens it (tarfile ``r|`` over formats.tar's own bounded
decompressed stream, its extended headers bounded), and plain tarfile with none of its bounds
(``r|gz``, tarfile inflating, or ``r|``). Prints the median times, the ratio formats.tar /
plain tarfile (what the bounds cost), and whether both wrote the same files and contents.

- A Flatcar container tarball: a root file system, ``tar -czf`` of it, gzip at its default
  level, members named ``./usr/...`` (tests/integration/fixtures/container_tarball.py, whose
  docstring gives the real one's layout: about 377 MiB). Here /usr/share is the root's bulk,
  /usr/include the kernel's build tree and /usr/lib/x86_64-linux-gnu Gentoo's /usr/lib64.
  kbuild/container.py writes only the build tree and the libraries and skips the rest.
- A .run payload: a GNU tar of a driver-like tree, ``./``-prefixed names, owned by root,
  compressed by ``zstd -T2`` (tests/integration/fixtures/runfile.py's write_tar and
  COMPRESSORS; docs/nvidia-run-format.md section 2: zstd since 530.30.02, 1,189 members and
  1.8 GB uncompressed in 610.57.04). Here /usr/lib/python3.11 and /usr/lib/x86_64-linux-gnu.
  image/runfile.py reads it from the ``zstd -d`` pipe and writes every member.
Needs GNU tar and zstd; no root, no network.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))

from readers import digests, measuring, options

from nvidia_driver import limits
from nvidia_driver.formats import output, tar
from nvidia_driver.image import runfile
from nvidia_driver.kbuild import container

KERNEL = "6.12.0-flatcar"
# (source on this machine, its name in the archive)
CONTAINER_TREES = (
    ("usr/share", "usr/share"),
    ("usr/include", f"usr/lib/modules/{KERNEL}/build/include"),
    ("usr/lib/x86_64-linux-gnu", "usr/lib64"),
)
RUN_TREES = (
    ("usr/lib/python3.11", "kernel/python3.11"),
    ("usr/lib/x86_64-linux-gnu", "lib"),
)
Reader = Callable[[Path, Path], None]  # (archive, output directory)


def absolute_links(trees: tuple[tuple[str, str], ...]) -> list[str]:
    """--exclude options for the links to absolute paths under trees: a .run has none (its
    links are relative, docs/nvidia-run-format.md section 3.3) and runfile.py refuses them."""
    paths = [path for source, _ in trees for path in (Path("/") / source).rglob("*")]
    return [f"--exclude=./{path.relative_to('/')}" for path in paths
            if path.is_symlink() and path.readlink().is_absolute()]  # fmt: skip


def make_archive(
    trees: tuple[tuple[str, str], ...], compressor: list[str], out: Path, excludes: list[str]
) -> int:
    """GNU tar of trees (renamed as given), through compressor; the count of its members."""
    transforms = [f"--transform=s,^\\./{src},./{dst},S" for src, dst in trees]
    sources = [f"./{src}" for src, _ in trees]
    with out.open("wb") as sink:
        tar_process = subprocess.Popen(
            ["tar", "-C", "/", "--sort=name", "--numeric-owner", "--owner=0", "--group=0",
             "--format=gnu", "--ignore-failed-read", *excludes, *transforms, "-cf", "-", *sources],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert tar_process.stdout is not None
        subprocess.run(compressor, stdin=tar_process.stdout, stdout=sink, check=True)
        tar_process.stdout.close()
        tar_process.wait()
    listing = subprocess.run(["tar", "-tf", str(out), "-I", compressor[0]], capture_output=True,
                             check=True).stdout  # fmt: skip
    return listing.count(b"\n")


# --- the container tarball: kbuild/container.py's extraction ---------------------------------


def container_formats_tar(archive: Path, out: Path) -> None:
    (out / "tree").mkdir()
    (out / "lib").mkdir()
    with archive.open("rb") as stream:
        extraction = container._read_container_archive(stream, out / "tree", out / "lib", None)  # noqa: SLF001
    extraction.refuse_escaping_links()


def container_tarfile(archive: Path, out: Path) -> None:
    (out / "tree").mkdir()
    (out / "lib").mkdir()
    tree, libraries = output.TreeWriter(out / "tree", "x"), output.TreeWriter(out / "lib", "x")
    budget = tar.Budget(limits.CONTAINER_ENTRIES, limits.CONTAINER_WRITTEN, limits.CONTAINER_MEMBER)
    with archive.open("rb") as stream, tarfile.open(fileobj=stream, mode="r|gz") as plain:
        reader = tar.TarStream(plain, budget)
        # The code measured is container.py's own, fed by plain tarfile.
        extraction = container._ContainerExtraction(reader, tree, libraries, None)  # noqa: SLF001
        for member in reader.members():
            extraction.member(member)
    extraction.refuse_escaping_links()


# --- the .run payload: every member written, as image/runfile.py writes it ------------------


@contextmanager
def _zstd_pipe(archive: Path) -> Iterator[IO[bytes]]:
    with archive.open("rb") as raw:
        process = subprocess.Popen(["zstd", *runfile.ZSTD_DECOMPRESS], stdin=raw,
                                   stdout=subprocess.PIPE)  # fmt: skip
        assert process.stdout is not None
        with process.stdout as pipe:
            yield pipe
        if process.wait() != 0:
            raise RuntimeError("zstd failed")


def run_formats_tar(archive: Path, out: Path) -> None:
    with _zstd_pipe(archive) as pipe:
        runfile._untar(pipe, None, out)  # noqa: SLF001 - the code measured


def run_tarfile(archive: Path, out: Path) -> None:
    writer = output.TreeWriter(out, "x")
    budget = tar.Budget(limits.RUN_ENTRIES, limits.RUN_WRITTEN, limits.RUN_MEMBER)
    with _zstd_pipe(archive) as pipe, tarfile.open(fileobj=pipe, mode="r|") as plain:
        reader = tar.TarStream(plain, budget)
        for member in reader.members():
            runfile._unpack(reader, member, writer)  # noqa: SLF001 - runfile.py's own
    tar.refuse_escaping_links(writer)


# --- measuring ------------------------------------------------------------------------------


class Archive(NamedTuple):
    what: str  # what it stands for
    trees: tuple[tuple[str, str], ...]
    compressor: list[str]
    excludes: Callable[[tuple[tuple[str, str], ...]], list[str]]
    extraction: str  # what extracts it, and what it writes
    readers: list[tuple[str, Reader]]  # plain tarfile first: the ratios are to it


ARCHIVES = (
    Archive(
        "container tarball", CONTAINER_TREES, ["gzip", "-c"], lambda _: [],
        "kbuild/container.py's extraction (build tree and libraries written, rest skipped):",
        [("tarfile r|gz", container_tarfile),
         ("formats.tar (r| over its gzip reader)", container_formats_tar)],
    ),
    Archive(
        ".run payload", RUN_TREES, ["zstd", "-q", "-T2", "-c"], absolute_links,
        "image/runfile.py's extraction (every member written), from the zstd -d pipe:",
        [("tarfile r|", run_tarfile), ("formats.tar (r| over its bound)", run_formats_tar)],
    ),
)  # fmt: skip


def median_seconds(
    readers: list[tuple[str, Reader]], archive: Path, scratch: Path, runs: int
) -> list[tuple[str, float, Path]]:
    """Each reader's median time and its last output; the readers take turns, run by run, so
    that a change in the machine's load falls on all of them."""
    samples: dict[str, list[float]] = {label: [] for label, _ in readers}
    outs: dict[str, Path] = {}
    for run in range(runs):
        for label, extract in readers:
            out = outs[label] = scratch / f"{extract.__name__}-{run}"
            out.mkdir()
            started = time.perf_counter()
            extract(archive, out)
            samples[label].append(time.perf_counter() - started)
            if run < runs - 1:
                shutil.rmtree(out)
    return [(label, statistics.median(samples[label]), outs[label]) for label, _ in readers]


def compare(archive: Archive, scratch: Path, runs: int) -> list[str]:
    """Make the archive, print each reader's median and its ratio to the first's; the ratios,
    said in a line each."""
    path = scratch / archive.what.replace(" ", "-")
    members = make_archive(archive.trees, archive.compressor, path, archive.excludes(archive.trees))
    sources = ", ".join(f"/{source}" for source, _ in archive.trees)
    print(f"{archive.what}: {path.stat().st_size / 2**20:.0f} MiB {archive.compressor[0]}, "
          f"{members} members ({sources})")  # fmt: skip
    print(archive.extraction)
    results = median_seconds(archive.readers, path, scratch, runs)
    base_label, base_seconds, base_out = results[0]
    base = digests(base_out)
    said = []
    for label, seconds, out in results:
        same = "" if out == base_out else f", same files: {'yes' if digests(out) == base else 'no'}"
        ratio = seconds / base_seconds
        print(f"  {label:<38} {seconds:6.2f} s  ratio {ratio:4.2f}{same}")
        if out != base_out:
            said.append(f"  {archive.what}, {label} / {base_label}: {ratio:.2f}")
    for _, _, out in results:
        shutil.rmtree(out)
    print(f"  written: {len(base)} files and links")
    path.unlink()
    return said


def main() -> int:
    args = options(__doc__, runs=5).parse_args()
    with measuring("tar_reader", args, ("tar", "gzip", "zstd")) as scratch:
        ratios = [line for archive in ARCHIVES for line in compare(archive, scratch, args.runs)]
        print(f"median of {args.runs} runs each; ratio formats.tar / plain tarfile:")
        print("\n".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
