"""What extracting the developer container's ext4 costs: debugfs, as the entrypoint runs it.

Usage: python benchmarks/ext4_reader.py [--source DIR] [--runs N] [--record]
Packs DIR (default /usr/include) into an ext4 filesystem with ``mkfs.ext4 -d``, 2 MiB into a
disk file as partition 9 lies in the developer container, extracts it whole with
``devcontainer.extract_root`` (``debugfs -R rdump`` at that offset, then the tree settled), and
prints the median time, the rate, the bytes on disk beside the source's, and whether the
extracted tree holds the source's files, contents and links. Needs e2fsprogs; no root.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))

from readers import digests, measuring, options

from nvidia_driver.commands import Commands
from nvidia_driver.kbuild import devcontainer

HEADROOM = 64 << 20  # the filesystem's free space beyond what the source takes
OFFSET = 2 << 20  # where partition 9 starts in Flatcar's developer container


def tree_bytes(top: Path) -> int:
    """Bytes the files under top take on disk (holes take none)."""
    return sum(path.lstat().st_blocks * 512 for path in top.rglob("*"))


def make_disk(source: Path, disk: Path) -> devcontainer.Partition:
    size = (tree_bytes(source) * 2 + HEADROOM) >> 20 << 20
    with disk.open("wb") as file:
        file.truncate(OFFSET + size)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(source), "-E", f"offset={OFFSET}",
         str(disk), str(size // 4096)],
        check=True,
    )  # fmt: skip
    return devcontainer.Partition(9, "ROOT", devcontainer.LINUX_FILESYSTEM, OFFSET, size)


def extract(disk: Path, partition: devcontainer.Partition, out: Path) -> float:
    out.mkdir()
    started = time.perf_counter()
    with open(os.devnull, "w") as quiet, redirect_stdout(quiet):  # noqa: PTH123
        devcontainer.extract_root(disk, partition, ["/"], out, label=disk.name, commands=Commands())
    return time.perf_counter() - started


def main() -> int:
    parser = options(__doc__, runs=3)
    parser.add_argument("--source", type=Path, default=Path("/usr/include"))
    args = parser.parse_args()
    with measuring("ext4_reader", args, ("debugfs", "mkfs.ext4")) as scratch:
        disk = scratch / "disk.bin"
        partition = make_disk(args.source, disk)
        files = sum(1 for path in args.source.rglob("*") if path.is_file())
        source_bytes = tree_bytes(args.source)
        print(f"filesystem: {partition.size >> 20} MiB ext4 of {args.source} ({files} files)")
        samples = []
        for run in range(args.runs):
            out = scratch / f"out-{run}"
            samples.append(extract(disk, partition, out))
            shutil.rmtree(out / "lost+found")
            if run < args.runs - 1:
                shutil.rmtree(out)
        seconds = statistics.median(samples)
        print(f"extract_root (debugfs rdump): {seconds:6.2f} s (median of {args.runs})")
        print(f"rate:                         {source_bytes / seconds / 1e6:6.0f} MB/s on disk")
        print(f"on disk: source {source_bytes:,} bytes, extracted {tree_bytes(out):,}")
        same = digests(out) == digests(args.source)
        print(f"same files, contents and links as the source: {'yes' if same else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
