"""The project's tar reader (formats/tar.py) beside the stdlib's tarfile in stream mode.

Usage: python benchmarks/tar_reader.py [--runs N] [--record]
Builds two archives from trees on this machine, in the layouts the extraction reads, and
extracts each with both readers through the same checks and TreeWriter; prints the median
times, the ratio tarfile / formats.tar, and whether both wrote the same files and contents.

- A Flatcar container tarball: a root file system, ``tar -czf`` of it, gzip at its default
  level, members named ``./usr/...`` (tests/integration/fixtures/container_tarball.py, whose
  docstring gives the real one's layout: about 377 MiB). Here /usr/share is the root's bulk,
  /usr/include the kernel's build tree and /usr/lib/x86_64-linux-gnu Gentoo's /usr/lib64.
  kbuild/container.py writes only the build tree and the libraries and skips the rest. Three
  readers run it: formats.tar (the code today, inflating on a thread of its own); tarfile
  ``r|gz``; and tarfile ``r|`` reading tar.Inflated's thread (the inflating kept, the parser
  dropped).
- A .run payload: a GNU tar of a driver-like tree, ``./``-prefixed names, owned by root,
  compressed by ``zstd -T2`` (tests/integration/fixtures/runfile.py's write_tar and
  COMPRESSORS; docs/nvidia-run-format.md section 2: zstd since 530.30.02, 1,189 members and
  1.8 GB uncompressed in 610.57.04). Here /usr/lib/python3.11 and /usr/lib/x86_64-linux-gnu.
  image/runfile.py reads it today with tarfile ``r|`` from the ``zstd -d`` pipe, writing every
  member; formats.tar reads the same pipe, which a thread hands over as Inflated would.
Needs GNU tar and zstd; no root, no network.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, Literal, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))

from record import Report, add_record_option

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
GOAL = 1.2  # issue 38: tarfile replaces formats/tar.py's parser if within this of it


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


def digests(top: Path) -> dict[str, str]:
    """Each regular file's SHA-256 and each link's target, by path under top."""
    found = {}
    for path in sorted(top.rglob("*")):
        name = str(path.relative_to(top))
        if path.is_symlink():
            found[name] = f"-> {path.readlink()}"
        elif path.is_file():
            with path.open("rb") as data:
                found[name] = hashlib.file_digest(data, "sha256").hexdigest()
    return found


# --- the container tarball: kbuild/container.py's extraction, fed by each reader ------------


class _TarfileData:
    """What _ContainerExtraction reads a member's bytes from (write_to), over tarfile."""

    def __init__(self, archive: tarfile.TarFile) -> None:
        self.archive = archive
        self.member: tarfile.TarInfo | None = None

    def write_to(self, fd: int, size: int) -> None:
        assert self.member is not None
        data = self.archive.extractfile(self.member)
        assert data is not None
        while size > 0 and (chunk := data.read(min(size, tar.CHUNK))):
            output.write_all(fd, chunk)
            size -= len(chunk)


def _as_member(info: tarfile.TarInfo) -> tar.Member:
    kind = tarfile.REGTYPE if info.isreg() else info.type  # tarfile's regular types are tar's
    return tar.Member(info.name, kind, info.size, info.mode, info.mtime, info.linkname,
                      info.issparse())  # fmt: skip


def _container_roots(out: Path) -> tuple[Path, Path]:
    (out / "tree").mkdir()
    (out / "lib").mkdir()
    return out / "tree", out / "lib"


def _container_with_tarfile(stream: IO[bytes], out: Path, mode: Literal["r|gz", "r|"]) -> None:
    _container_roots(out)
    tree, libraries = output.TreeWriter(out / "tree", "x"), output.TreeWriter(out / "lib", "x")
    with tarfile.open(fileobj=stream, mode=mode) as archive:
        data = _TarfileData(archive)
        # The code measured is container.py's own; data stands in for tar.Inflated.
        extraction = container._ContainerExtraction(data, tree, libraries, None)  # type: ignore[arg-type]  # noqa: SLF001
        for info in archive:
            data.member = info
            extraction.member(_as_member(info))
    extraction.refuse_escaping_links()


def container_formats_tar(archive: Path, out: Path) -> None:
    with archive.open("rb") as stream:
        roots = _container_roots(out)
        extraction = container._read_container_archive(stream, *roots, None)  # noqa: SLF001
    extraction.refuse_escaping_links()


def container_tarfile(archive: Path, out: Path) -> None:
    with archive.open("rb") as stream:
        _container_with_tarfile(stream, out, "r|gz")


def container_tarfile_threaded(archive: Path, out: Path) -> None:
    with archive.open("rb") as stream:
        inflated = tar.Inflated(stream, limits.CONTAINER_INFLATED)
        try:
            _container_with_tarfile(inflated, out, "r|")  # type: ignore[arg-type]
        finally:
            inflated.close()


# --- the .run payload: every member written, as image/runfile.py writes it ------------------


class _Piped(tar.Inflated):
    """Inflated's reading thread, handing over bytes already decompressed (the zstd pipe)."""

    def _inflate(self) -> None:
        while chunk := self._stream.read(tar.CHUNK):
            if not self._put(chunk):
                return
        self._put(None)


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


def run_tarfile(archive: Path, out: Path) -> None:
    with _zstd_pipe(archive) as pipe:
        runfile._untar(pipe, out)  # noqa: SLF001 - the code measured


def run_formats_tar(archive: Path, out: Path) -> None:
    writer = output.TreeWriter(out, "x")
    budget = tar.Budget(limits.RUN_ENTRIES, limits.RUN_WRITTEN, limits.RUN_MEMBER)
    with _zstd_pipe(archive) as pipe:
        data = _Piped(cast("BinaryIO", pipe), limits.RUN_INFLATED)
        try:
            for member in tar.members(data):
                _run_member(data, member, writer, budget)
        finally:
            data.close()
    tar.refuse_escaping_links(writer)


def _run_member(
    data: tar.Inflated, member: tar.Member, writer: output.TreeWriter, budget: tar.Budget
) -> None:
    """What runfile._unpack does with a tarfile member, with a formats.tar one."""
    rel = tar.member_path(member.name)
    budget.take(member.name, member.size if member.kind in tar.REGULAR else None)
    if member.kind == tar.DIRECTORY:
        writer.directory(rel)
    elif member.kind in (tar.SYMLINK, tar.HARDLINK) and member.linkname.startswith("/"):
        raise tar.UnsafeMemberError(f"a link to an absolute path ({member.name})")
    elif member.kind == tar.SYMLINK:
        writer.symlink(rel, tar.symlink_target(rel, member.name, member.linkname), member.mtime)
    elif member.kind == tar.HARDLINK:
        writer.hardlink(rel, writer.path(tar.member_path(member.linkname)))
    elif member.kind in tar.REGULAR:
        size = member.size
        mode = runfile._data_mode(member.mode)  # noqa: SLF001 - as runfile.py writes it
        writer.file(rel, mode, member.mtime, lambda fd: data.write_to(fd, size))
    else:
        raise tar.UnsafeMemberError(f"a special file ({member.name})")


# --- measuring ------------------------------------------------------------------------------


def median_seconds(
    readers: list[tuple[str, Callable[[Path, Path], None]]], archive: Path, scratch: Path, runs: int
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


def compare(
    title: str,
    archive: Path,
    readers: list[tuple[str, Callable[[Path, Path], None]]],
    scratch: Path,
    runs: int,
) -> dict[str, float]:
    """Print each reader's median and its ratio to the first's; the ratios, by reader."""
    print(title)
    results = median_seconds(readers, archive, scratch, runs)
    base_seconds, base_out = results[0][1], results[0][2]
    base = digests(base_out)
    ratios = {}
    for label, seconds, out in results:
        same = "" if out == base_out else f", same files: {'yes' if digests(out) == base else 'no'}"
        ratio = ratios[label] = seconds / base_seconds
        print(f"  {label:<34} {seconds:6.2f} s  ratio {ratio:4.2f}{same}")
    for _, _, out in results:
        shutil.rmtree(out)
    print(f"  written: {len(base)} files and links")
    del ratios[results[0][0]]
    return ratios


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=5)
    add_record_option(options)
    args = options.parse_args()
    if shutil.which("tar") is None or shutil.which("zstd") is None:
        print("needs GNU tar and zstd", file=sys.stderr)
        return 1
    with (
        Report("tar_reader", record=args.record),
        tempfile.TemporaryDirectory(prefix="tar-bench.", dir="/var/tmp") as name,
    ):
        scratch = Path(name)
        tarball = scratch / "flatcar-container.tar.gz"
        members = make_archive(CONTAINER_TREES, ["gzip", "-c"], tarball, [])
        sources = ", ".join(f"/{source}" for source, _ in CONTAINER_TREES)
        print(f"container tarball: {tarball.stat().st_size / 2**20:.0f} MiB gzip, "
              f"{members} members ({sources})")  # fmt: skip
        container_ratio = compare(
            "kbuild/container.py's extraction (build tree and libraries written, rest skipped):",
            tarball,
            [("formats.tar (inflating thread)", container_formats_tar),
             ("tarfile r|gz", container_tarfile),
             ("tarfile r| over tar.Inflated", container_tarfile_threaded)],
            scratch, args.runs,
        )  # fmt: skip
        payload = scratch / "payload.tar.zst"
        members = make_archive(RUN_TREES, ["zstd", "-q", "-T2", "-c"], payload,
                               absolute_links(RUN_TREES))  # fmt: skip
        sources = ", ".join(f"/{source}" for source, _ in RUN_TREES)
        print(f".run payload: {payload.stat().st_size / 2**20:.0f} MiB zstd, {members} members "
              f"({sources})")  # fmt: skip
        run_ratio = compare(
            "image/runfile.py's extraction (every member written), from the zstd -d pipe:",
            payload,
            [("formats.tar (reading thread)", run_formats_tar),
             ("tarfile r| (runfile.py today)", run_tarfile)],
            scratch, args.runs,
        )  # fmt: skip
        print(f"median of {args.runs} runs each; ratio tarfile / formats.tar, goal <= {GOAL}:")
        for what, ratios in (("container tarball", container_ratio), (".run", run_ratio)):
            for label, ratio in ratios.items():
                verdict = "within" if ratio <= GOAL else "beyond"
                print(f"  {what}, {label}: {ratio:.2f} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
