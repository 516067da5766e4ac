"""The OCI distribution API's ideas are defined once, in nvidia_driver.formats.oci: the reboot
gate's registry client and the tooling's import them (issue 39). A media type, a digest's
grammar or a function of that module written again anywhere in the entrypoint or the tooling
is a second reader that can drift from the first."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OCI = ROOT / "entrypoint" / "src" / "nvidia_driver" / "formats" / "oci.py"
SOURCES = [*(ROOT / "entrypoint" / "src").rglob("*.py"), *(ROOT / "tooling").rglob("*.py")]
# A media type of the OCI or Docker image specs, and a SHA-256 digest's grammar.
RESTATED = re.compile(r"application/vnd\.(?:oci|docker)\.|sha256:\{?SHA256_HEX|sha256:\[0-9a-f\]")


# Same name, another idea: the driver root's file list (its constants' limits are their own).
OTHER_IDEAS = {("entrypoint/src/nvidia_driver/image/manifest.py", "Manifest")}


def _defined(path: Path) -> set[str]:
    """The functions and classes a module defines at its top (media types and the digest's
    grammar, the constants, are found by their text)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}


def test_oci_media_types_and_digest_grammar_are_written_once() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in SOURCES
        if path != OCI
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if RESTATED.search(line)
    ]
    assert not found, "import these from nvidia_driver.formats.oci:\n" + "\n".join(found)


def test_no_module_defines_again_what_the_oci_module_defines() -> None:
    # Private helpers are the module's own; a public name defined twice is a second copy.
    public = {name for name in _defined(OCI) if not name.startswith("_")}
    twice = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in SOURCES
        if path != OCI
        for name in sorted(_defined(path) & public)
        if (str(path.relative_to(ROOT)), name) not in OTHER_IDEAS
    ]
    assert not twice, "defined in nvidia_driver.formats.oci already:\n" + "\n".join(twice)


def test_the_scan_sees_a_copy() -> None:
    assert RESTATED.search('INDEX = "application/vnd.oci.image.index.v1+json"')
    assert RESTATED.search('DIGEST = re.compile(f"sha256:{SHA256_HEX.pattern}")')
    assert {"plain_http", "checked_digest", "Manifest"} <= _defined(OCI)
