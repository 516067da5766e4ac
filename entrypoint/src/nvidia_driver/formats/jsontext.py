"""JSON from a server or a feed, read so that it raises only DriverError.

A document nested deeper than MAX_DEPTH is refused: the bound is the reader's own, checked
without recursion after the parse. It used to be the interpreter's recursion limit (about
1,000, a RecursionError); Python 3.14, which the images run, checks the C stack instead and
parses such a document, and the code that walks it would then meet the limit itself.
UnicodeDecodeError for bytes that are not UTF-8, and ValueError for an integer over Python's
4,300 digits, are each a DriverError here too, with the line saying which. The byte bound is
the reader's (the HTTP client's ``max_bytes``).
"""

from __future__ import annotations

import json
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.safetext import shown

# Kubernetes objects, manifests and feeds nest a few tens deep; the project's walkers recurse.
MAX_DEPTH = 200
DEEPER = f"nested deeper than the reader's bound of {MAX_DEPTH}"


def parse(data: bytes | str, what: str, fix: str = "") -> Any:
    """The document in ``data``; the error names it by ``what`` and ends in ``fix``."""
    try:
        document = json.loads(data)
    except RecursionError:  # Python before 3.14: deeper than MAX_DEPTH too
        why = DEEPER
    except ValueError as exc:  # not JSON, not UTF-8, or an integer over 4,300 digits
        why = shown(str(exc), 120)
    else:
        if not too_deep(document):
            return document
        why = DEEPER
    raise DriverError(f"{what}: not JSON ({why}){f'; {fix}' if fix else ''}")


def too_deep(document: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether the document nests arrays and objects more than ``limit`` deep (no recursion)."""
    level = [document] if isinstance(document, (dict, list)) else []
    for _ in range(limit):  # level holds the containers one deeper each time round
        if not level:
            return False
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
    return bool(level)
