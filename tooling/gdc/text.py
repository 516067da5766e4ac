"""What the tasks print: plain-text tables, their counts, and an error on one line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is never padded."""
    lines = [list(headers), *(list(row) for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers) - 1)]
    return "".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(line, widths, strict=False)),
                   line[-1]]).rstrip() + "\n"
        for line in lines
    )  # fmt: skip


def counts(rows: Iterable[Sequence[str]]) -> str:
    """``built 2, failed 1``: how many rows have each first cell, in the order first seen."""
    return ", ".join(f"{status} {count}" for status, count in Counter(r[0] for r in rows).items())


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it says nothing."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
