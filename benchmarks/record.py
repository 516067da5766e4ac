"""The one place benchmark figures are kept: docs/benchmarks.md, written by the scripts.

Each benchmark prints its figures inside a :class:`Report`; run with ``--record``, it also
replaces its own section of docs/benchmarks.md with what it printed and, beside it, the command,
the date, the commit and the machine. A figure is never typed in by hand, so none goes stale
without its date and commit saying so. A run that fails records nothing.

    with Report("cli_startup", record=args.record):
        print(f"ratio --help / bare start: {ratio:.2f}")
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Self, TextIO

REPOSITORY = Path(__file__).resolve().parent.parent
DOCS = REPOSITORY / "docs" / "benchmarks.md"
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_HEADER = """\
# Benchmarks

Every figure below was printed by a script in `benchmarks/`, run with `--record`, which rewrites
its own section of this file: the command, the date, the commit and the machine stand beside
the figures. Run a script again to refresh its section; do not edit the sections by hand.
"""


def _begin(name: str) -> str:
    return f"<!-- begin {name}: written by benchmarks/{name}.py --record -->"


def _end(name: str) -> str:
    return f"<!-- end {name} -->"


def commit() -> str:
    """HEAD's short hash, with "+ uncommitted changes" when the tree differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True,
                              text=True, check=False).stdout.strip()  # fmt: skip

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return f"{head} + uncommitted changes" if git("status", "--porcelain") else head


def machine() -> str:
    """Cores, CPU model, memory, kernel and the load when the benchmark started."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = f" ({found.group(1).strip()})" if found else ""
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        found = re.search(r"^MemTotal:\s*(\d+) kB", meminfo.read_text(), re.MULTILINE)
        memory = f", {int(found.group(1)) / (1 << 20):.0f} GiB" if found else ""
    load = ", load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return f"{os.cpu_count()} cores{model}{memory}, {platform.system()} {platform.release()}{load}"


class _Tee:
    """stdout, kept as well as printed."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.kept: list[str] = []

    def write(self, text: str) -> int:
        self.kept.append(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


class Report:
    """What one benchmark prints, and with record=True its section of docs/benchmarks.md."""

    def __init__(
        self,
        name: str,
        *,
        record: bool,
        argv: list[str] | None = None,
        docs: Path = DOCS,
        measured: str | None = None,
    ) -> None:
        """The date, the machine's load and the commit are taken when the report is made (made
        before a long run, they are the run's start: ci_run.py); ``measured`` is the commit the
        figures are of when it is not this checkout's HEAD (a clone made earlier)."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"benchmark name {name!r} is not [a-z][a-z0-9_]*")
        self.name = name
        self.record = record
        self.docs = docs
        argv = sys.argv if argv is None else argv
        script = Path(argv[0]).resolve()
        shown = script.relative_to(REPOSITORY) if script.is_relative_to(REPOSITORY) else script
        self.command = shlex.join(["python", str(shown), *argv[1:]])
        self.started = dt.datetime.now(dt.UTC)
        self.machine = machine()
        self.commit = measured or commit()
        self._tee: _Tee | None = None

    def __enter__(self) -> Self:
        self._tee = _Tee(sys.stdout)
        sys.stdout = self._tee
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        assert self._tee is not None
        sys.stdout = self._tee.out
        if self.record and kind is None:
            self._write("".join(self._tee.kept).rstrip("\n").splitlines())

    def _write(self, lines: list[str]) -> None:
        section = "\n".join([
            _begin(self.name),
            f"## {self.name}",
            "",
            f"- command: `{self.command}`",
            f"- date: {self.started:%Y-%m-%d %H:%M} UTC",
            f"- commit: {self.commit}",
            f"- machine: {self.machine}",
            "",
            "```",
            *lines,
            "```",
            _end(self.name),
        ])  # fmt: skip
        docs = self.docs
        text = docs.read_text() if docs.exists() else _HEADER
        pattern = re.compile(re.escape(_begin(self.name)) + ".*?" + re.escape(_end(self.name)),
                             re.DOTALL)  # fmt: skip
        if pattern.search(text):
            text = pattern.sub(lambda _: section, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        temporary = docs.with_name(f".{docs.name}.{os.getpid()}")
        temporary.write_text(text)
        temporary.replace(docs)
        shown = docs.relative_to(REPOSITORY) if docs.is_relative_to(REPOSITORY) else docs
        print(f"recorded in {shown}")


def add_record_option(parser: argparse.ArgumentParser) -> None:
    """--record: the one option every benchmark takes to write its section."""
    parser.add_argument("--record", action="store_true",
                        help="also write these figures to docs/benchmarks.md")  # fmt: skip
