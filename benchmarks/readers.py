"""What the reader benchmarks (ext4_reader.py, tar_reader.py) share: their options, a scratch
directory inside their report, and what tells whether two extracted trees hold the same."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from record import Report, add_record_option


def options(doc: str, runs: int) -> argparse.ArgumentParser:
    """--runs (runs by default) and --record; the description, doc's first line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=runs)
    add_record_option(parser)
    return parser


@contextmanager
def measuring(name: str, args: argparse.Namespace, tools: tuple[str, ...]) -> Iterator[Path]:
    """A scratch directory in /var/tmp (the trees are large, /tmp may be a small tmpfs), inside
    benchmark name's Report; exits at once, saying so, if one of tools is not on PATH."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} on PATH")
    with (
        Report(name, record=args.record),
        tempfile.TemporaryDirectory(prefix=f"{name}.", dir="/var/tmp") as scratch,
    ):
        yield Path(scratch)


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
