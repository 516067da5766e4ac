"""Which gcc built each Flatcar release line's kernel, and the build image's compiler for it.

Flatcar builds its kernels with its SDK's ``sys-devel/gcc``; the modules are built with the same
gcc major, which the runtime build reads from the kernel's ``.config`` (kbuild/compiler.py). So
the build image carries one ``gcc-<major>`` per major that a live release was built with, and no
other (images/build/Dockerfile). :data:`LINES` is the one record of which: docs/building.md's
table is made from it (``PYTHONPATH=tooling python -m gdc.compilers --markdown``), and the unit
tests check that table and the Dockerfile's compilers against it.

Sources: the gcc each release's kernel names (its banner and ``CONFIG_CC_VERSION_TEXT``, e.g.
"x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1 p4) 14.3.1") and the ``sys-devel/gcc`` of
Flatcar's SDK; the image's versions are Debian forky's packages, as the Dockerfile records them.
When a major leaves the last live release, drop its line here and its ``gcc-<major>`` from the
Dockerfile; when a new one arrives, add both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gdc.text import format_table


@dataclass(frozen=True)
class ReleaseLine:
    """Flatcar releases whose kernels one gcc major built."""

    releases: str  # the Flatcar majors, as a reader says them
    kernels: str  # their kernel series
    sdk_gcc: str  # the Flatcar SDK's sys-devel/gcc that built them
    major: int  # the image's gcc-<major>
    image_gcc: str  # Debian forky's version of gcc-<major>, in the image
    live: str  # the live releases that need it


AS_OF = "Flatcar's releases up to August 2026"
LINES = (
    ReleaseLine("4081 (LTS) to 4152", "6.6", "13.3.1", 13, "13.5.0", "LTS 4081.3.10"),
    ReleaseLine("4186 to 4593", "6.6, 6.12", "14.2.1 to 14.3.1", 14, "14.4.0", "stable 4593.2.5"),
    ReleaseLine(
        "4628 and later",
        "6.12",
        "15.2.1 (alpha 4790: 15.3.0)",
        15,
        "15.3.0",
        "beta 4757.1.0, alpha 4790.0.0",
    ),
)
HEADER = (
    "Flatcar release",
    "kernel",
    "SDK gcc",
    "image's compiler (Debian forky)",
    "live release that needs it",
)


def majors() -> tuple[int, ...]:
    """The gcc majors the build image carries: one per line, oldest first."""
    return tuple(line.major for line in LINES)


def _rows() -> list[tuple[str, ...]]:
    return [
        (line.releases, line.kernels, line.sdk_gcc, f"`gcc-{line.major}` ({line.image_gcc})",
         line.live)
        for line in LINES
    ]  # fmt: skip


def markdown() -> str:
    """The table docs/building.md carries, and the date of its facts."""

    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"

    rows = [cells(HEADER), cells(("---",) * len(HEADER)), *(cells(row) for row in _rows())]
    return "\n".join(rows) + f"\n\n({AS_OF}.)\n"


def text() -> str:
    """The same table, in columns."""
    rows = [tuple(cell.replace("`", "") for cell in row) for row in _rows()]
    return format_table(HEADER, rows) + f"({AS_OF}.)\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gdc.compilers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--markdown", action="store_true", help="as the table of docs/building.md")
    args = parser.parse_args(argv)
    sys.stdout.write(markdown() if args.markdown else text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
