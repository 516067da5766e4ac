"""versions.toml edited as text: one driver's entry replaced or added, everything else kept.

A table's lines run from its header to the last line before the next header that is not a
comment or blank (comments just above a header belong to that header's table): :func:`tables`,
which gdc.peers edits peers.toml by too. A driver's entry is its tables, ``[drivers."<version>"]``
and ``[drivers."<version>".<sub>]`` (the ``redist`` table), which must follow each other. Lines
outside the entry, comments included, are kept byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gdc.nvidia import RecordError
from nvidia_driver.naming import driver_key

_HEADER = re.compile(r"\s*\[(?P<key>[^\[\]]+)\]\s*(#.*)?")
_DRIVER_TABLE = re.compile(r"""\s*drivers\s*\.\s*(?:"(?P<q>[^"]*)"|'(?P<l>[^']*)')\s*(\..*)?""")


@dataclass(frozen=True)
class _Span:
    version: str
    start: int  # index of its first header line
    end: int  # index after its last line


def tables(lines: list[str]) -> list[tuple[str, int, int]]:
    """Each table's key as its header spells it, its header's index and the index after its
    last line (module docstring), in file order."""
    headers = [(number, header["key"]) for number, line in enumerate(lines)
               if (header := _HEADER.fullmatch(line.rstrip("\n")))]  # fmt: skip
    found = []
    for index, (start, key) in enumerate(headers):
        end = headers[index + 1][0] if index + 1 < len(headers) else len(lines)
        while end > start + 1 and (not lines[end - 1].strip()
                                   or lines[end - 1].lstrip().startswith("#")):  # fmt: skip
            end -= 1
        found.append((key, start, end))
    return found


def _spans(lines: list[str]) -> list[_Span]:
    """Each driver's entry, in file order; refused when a driver's tables are apart."""
    spans: list[_Span] = []
    before: str | None = None  # the driver of the table before, if it is a driver's
    for key, start, end in tables(lines):
        table = _DRIVER_TABLE.fullmatch(key)
        version = None if table is None else (table["q"] or table["l"] or "")
        if version is not None and version == before:
            spans[-1] = _Span(version, spans[-1].start, end)
        elif version is not None and any(span.version == version for span in spans):
            raise RecordError(
                f"versions.toml: the tables of driver {version} are not together: move its "
                f'[drivers."{version}".redist] right after [drivers."{version}"]'
            )
        elif version is not None:
            spans.append(_Span(version, start, end))
        before = version
    return spans


def put_entry(text: str, entry: str, version: str, replaces: str | None) -> str:
    """``text`` with driver ``replaces``'s entry replaced by ``entry`` (for ``version``), or,
    when ``replaces`` is None, with ``entry`` added among the drivers in version order."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    spans = _spans(lines)
    new = entry.splitlines(keepends=True)
    if replaces is not None:
        found = [span for span in spans if span.version == replaces]
        if not found:
            raise RecordError(f'versions.toml has no [drivers."{replaces}"] table to replace')
        span = found[0]
        return "".join(lines[: span.start] + new + lines[span.end :])
    earlier = [span for span in spans if driver_key(span.version) < driver_key(version)]
    if earlier or not spans:
        at = earlier[-1].end if earlier else len(lines)
        return "".join([*lines[:at], "\n", *new, *lines[at:]])
    at = spans[0].start  # the oldest driver: before the first entry and the comments above it
    while at > 0 and lines[at - 1].lstrip().startswith("#"):
        at -= 1
    return "".join([*lines[:at], *new, "\n", *lines[at:]])
