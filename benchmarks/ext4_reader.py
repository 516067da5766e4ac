"""The project's ext4 reader beside ``debugfs -R rdump`` (e2fsprogs), on one image.

Usage: python benchmarks/ext4_reader.py [--source DIR] [--runs N] [--record]
Packs DIR (default /usr/include) into an ext4 image with ``mkfs.ext4 -d``, extracts the whole
image with each, and prints the median times, their ratio, the bytes each output takes on disk,
and whether both hold the same files with the same contents. Needs e2fsprogs; no root.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))

from record import Report, add_record_option

from nvidia_driver.formats.ext4 import Ext4

HEADROOM = 64 << 20  # the image's free space beyond what the source takes


def tree_bytes(top: Path) -> int:
    """Bytes the files under top take on disk (holes take none)."""
    return sum(path.lstat().st_blocks * 512 for path in top.rglob("*"))


def digests(top: Path) -> dict[str, str]:
    """Each regular file's SHA-256 and each link's target, by path under top."""
    found = {}
    for path in sorted(top.rglob("*")):
        name = str(path.relative_to(top))
        if path.is_symlink():
            found[name] = f"-> {path.readlink()}"
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def make_image(source: Path, image: Path) -> int:
    size = tree_bytes(source) * 2 + HEADROOM
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(source), str(image), f"{size >> 10}k"],
        check=True,
    )
    return image.stat().st_size


def with_reader(image: Path, size: int, out: Path) -> None:
    with image.open("rb") as disk, open(os.devnull, "w") as quiet, redirect_stdout(quiet):  # noqa: PTH123
        Ext4(disk.fileno(), 0, size, image.name).extract(["/"], out)


def with_debugfs(image: Path, _size: int, out: Path) -> None:
    out.mkdir()
    subprocess.run(
        ["debugfs", "-R", f"rdump / {out}", str(image)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def median_seconds(
    extract: Callable[[Path, int, Path], None], image: Path, size: int, scratch: Path, runs: int
) -> tuple[float, Path]:
    samples = []
    for run in range(runs):
        out = scratch / f"{extract.__name__}-{run}"
        started = time.perf_counter()
        extract(image, size, out)
        samples.append(time.perf_counter() - started)
        if run < runs - 1:
            shutil.rmtree(out)
    return statistics.median(samples), out


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--source", type=Path, default=Path("/usr/include"))
    options.add_argument("--runs", type=int, default=3)
    add_record_option(options)
    args = options.parse_args()
    if shutil.which("debugfs") is None or shutil.which("mkfs.ext4") is None:
        print("needs e2fsprogs (debugfs, mkfs.ext4)", file=sys.stderr)
        return 1
    with (
        Report("ext4_reader", record=args.record),
        tempfile.TemporaryDirectory(prefix="ext4-bench.", dir="/var/tmp") as name,
    ):
        scratch = Path(name)
        image = scratch / "root.ext4"
        size = make_image(args.source, image)
        files = sum(1 for path in args.source.rglob("*") if path.is_file())
        print(f"image: {size / 2**20:.0f} MiB ext4 of {args.source} ({files} files)")
        ours, ours_out = median_seconds(with_reader, image, size, scratch, args.runs)
        theirs, theirs_out = median_seconds(with_debugfs, image, size, scratch, args.runs)
        # rdump writes the root's entries into the directory it is given, lost+found too.
        shutil.rmtree(theirs_out / "lost+found", ignore_errors=True)
        shutil.rmtree(ours_out / "lost+found", ignore_errors=True)
        same = digests(ours_out) == digests(theirs_out)
        print(f"formats/ext4.py extract:   {ours:6.2f} s (median of {args.runs})")
        print(f"debugfs -R 'rdump / DIR':  {theirs:6.2f} s (median of {args.runs})")
        print(f"ratio debugfs / reader:    {theirs / ours:6.2f}")
        print(f"on disk: reader {tree_bytes(ours_out):,} bytes, debugfs {tree_bytes(theirs_out):,}")
        print(f"same files and contents: {'yes' if same else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
