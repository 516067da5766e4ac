"""JSON from a server: the depth bound is the reader's own, the same on every Python.

Python 3.11 raises RecursionError near its recursion limit; 3.14, which the images run, checks
the C stack instead and parses a document 1,000 deep, which the code walking it would then
fail on. Both refuse past MAX_DEPTH, with the same line.
"""

from __future__ import annotations

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext


def nested(depth: int) -> bytes:
    """Objects and arrays, alternately, ``depth`` deep."""
    opening = "".join('{"a":' if level % 2 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 else "]" for level in reversed(range(depth)))
    return f"{opening}1{closing}".encode()


def test_a_document_at_the_bound_is_read() -> None:
    document = jsontext.parse(nested(jsontext.MAX_DEPTH), "feed")
    assert not jsontext.too_deep(document)


@pytest.mark.parametrize("depth", [jsontext.MAX_DEPTH + 1, 1000, 5000])
def test_a_document_past_the_bound_is_refused_in_one_line(depth: int) -> None:
    with pytest.raises(DriverError) as refused:
        jsontext.parse(nested(depth), "GET /api/v1/nodes", "ask the cluster's admin")
    assert str(refused.value) == (
        f"GET /api/v1/nodes: not JSON ({jsontext.DEEPER}); ask the cluster's admin"
    )


def test_depth_counts_arrays_and_objects_alike() -> None:
    assert jsontext.too_deep([[1]], limit=1)
    assert not jsontext.too_deep([[1]], limit=2)
    assert not jsontext.too_deep({"a": [], "b": {}}, limit=2)
    assert not jsontext.too_deep("scalar", limit=0)
