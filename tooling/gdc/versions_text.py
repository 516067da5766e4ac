"""versions.toml edited as text: one driver's entry replaced or added, everything else kept.

A driver's entry is its tables, ``[drivers."<version>"]`` and ``[drivers."<version>".<sub>]``
(the ``redist`` table), which must follow each other: from the first header to the last line
before the next table that is not a comment or blank (comments just above a header belong to
that header's table). Lines outside the entry, comments included, are kept byte for byte.
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


def _spans(lines: list[str]) -> list[_Span]:
    """Each driver's entry, in file order; refused when a driver's tables are apart."""
    headers: list[tuple[int, str | None]] = []  # (line, driver version or None)
    for number, line in enumerate(lines):
        header = _HEADER.fullmatch(line.rstrip("\n"))
        if header is None:
            continue
        table = _DRIVER_TABLE.fullmatch(header["key"])
        headers.append((number, None if table is None else (table["q"] or table["l"] or "")))
    spans: list[_Span] = []
    for index, (start, version) in enumerate(headers):
        end = headers[index + 1][0] if index + 1 < len(headers) else len(lines)
        while end > start + 1 and (
            not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")
        ):
            end -= 1
        if version is None:
            continue
        if spans and spans[-1].version == version and headers[index - 1][1] == version:
            spans[-1] = _Span(version, spans[-1].start, end)
        elif any(span.version == version for span in spans):
            raise RecordError(
                f"versions.toml: the tables of driver {version} are not together: move its "
                f'[drivers."{version}".redist] right after [drivers."{version}"]'
            )
        else:
            spans.append(_Span(version, start, end))
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
