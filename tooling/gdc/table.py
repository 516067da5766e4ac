"""Plain-text tables for the tasks' reports: left-aligned columns, one header row."""

from __future__ import annotations

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
