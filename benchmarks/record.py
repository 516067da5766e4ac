"""The one place benchmark figures are kept: docs/benchmarks.md, written by the scripts.

Each benchmark prints its figures through a :class:`Report`; run with ``--record``, it also
replaces its own section of docs/benchmarks.md with those lines and, beside them, the command
that printed them, the date, the commit and the machine. A figure is never typed in by hand, so
none goes stale without its date and commit saying so.

    report = Report("cli_startup", record=args.record)
    report.line(f"ratio --help / bare start: {ratio:.2f}")
    report.finish()
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

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


class Report:
    """The lines one benchmark prints, and with record=True its section of docs/benchmarks.md."""

    def __init__(self, name: str, *, record: bool, argv: list[str] | None = None) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"benchmark name {name!r} is not [a-z][a-z0-9_]*")
        self.name = name
        self.record = record
        argv = sys.argv if argv is None else argv
        script = Path(argv[0]).resolve()
        shown = script.relative_to(REPOSITORY) if script.is_relative_to(REPOSITORY) else script
        self.command = shlex.join(["python", str(shown), *argv[1:]])
        self.started = dt.datetime.now(dt.UTC)
        self.machine = machine()  # the load before the benchmark's own work
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        """Print one line of figures, and keep it for the record."""
        print(text, flush=True)
        self.lines.append(text)

    def finish(self, docs: Path = DOCS) -> None:
        """With record=True, replace this benchmark's section of docs (made if missing)."""
        if not self.record:
            return
        section = "\n".join([
            _begin(self.name),
            f"## {self.name}",
            "",
            f"- command: `{self.command}`",
            f"- date: {self.started:%Y-%m-%d %H:%M} UTC",
            f"- commit: {commit()}",
            f"- machine: {self.machine}",
            "",
            "```",
            *self.lines,
            "```",
            _end(self.name),
        ])  # fmt: skip
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
