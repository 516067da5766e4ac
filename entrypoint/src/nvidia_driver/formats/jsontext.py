"""JSON from a server or a feed, read so that it raises only DriverError.

``json.loads`` raises RecursionError for a document nested deeper than the interpreter's
recursion limit (about 1,000: that is the depth bound), UnicodeDecodeError for bytes that are
not UTF-8, and ValueError for an integer over Python's 4,300 digits: each is a DriverError here,
with the line saying which. The byte bound is the reader's (the HTTP client's ``max_bytes``).
"""

from __future__ import annotations

import json
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.safetext import shown


def parse(data: bytes | str, what: str, fix: str = "") -> Any:
    """The document in ``data``; the error names it by ``what`` and ends in ``fix``."""
    try:
        return json.loads(data)
    except RecursionError:
        why = "nested deeper than the reader's bound"
    except ValueError as exc:  # not JSON, not UTF-8, or an integer over 4,300 digits
        why = shown(str(exc), 120)
    raise DriverError(f"{what}: not JSON ({why}){f'; {fix}' if fix else ''}")
