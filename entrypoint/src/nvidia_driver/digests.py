"""SHA-256 digests as the project records and passes them: the one check of a digest and the
one reader of a digest list.

A list is how one build argument carries several (image/provision.py's ``--sha256``, the
tooling's ``--driver-sha256`` and ``--redist-sha256``): one ``HEX`` for all, or
``KEY=HEX,KEY=HEX``, as ``amd64=HEX,arm64=HEX`` for a driver's .run and
``fabricmanager.amd64=HEX,...`` for the redist archives. Each caller checks the keys it takes.
"""

from __future__ import annotations

import re

from nvidia_driver.errors import DriverError

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The key of a list that is one HEX alone: it holds for every key.
ANY = ""


def valid_sha256(value: str, what: str) -> str:
    """value as 64 lowercase hex digits; else a DriverError that names what it is."""
    digest = value.strip().lower()
    if not SHA256_HEX.fullmatch(digest):
        raise DriverError(f"{what} is not a SHA-256 (64 hex digits): {value!r}")
    return digest


def digest_list(spec: str, what: str) -> dict[str, str]:
    """``HEX`` -> {ANY: HEX}; ``KEY=HEX,KEY=HEX`` -> {KEY: HEX}; every digest checked.

    Blanks around the items are ignored, and so is an empty list (no digests).
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if len(items) == 1 and "=" not in items[0]:
        return {ANY: valid_sha256(items[0], what)}
    digests = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise DriverError(f"{what} entry {item!r} is not KEY=<sha256>")
        digests[key] = valid_sha256(value, f"{what} {key}")
    return digests
