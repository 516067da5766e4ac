"""Ideas defined once, which the entrypoint and the tooling import: a copy written again
anywhere else is a second reader that can drift from the first.

* nvidia_driver.formats.oci: the OCI distribution API's media types, a digest's grammar, its
  registry helpers (issue 39);
* nvidia_driver.naming: the architectures' names and tables, NVIDIA's file names, and the
  grammars of driver, Flatcar and kernel versions and of a kernel's banner (issue 38).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OCI = ROOT / "entrypoint" / "src" / "nvidia_driver" / "formats" / "oci.py"
NAMING = ROOT / "entrypoint" / "src" / "nvidia_driver" / "naming.py"
SOURCES = [*(ROOT / "entrypoint" / "src").rglob("*.py"), *(ROOT / "tooling").rglob("*.py")]
# A media type of the OCI or Docker image specs, and a SHA-256 digest's grammar.
RESTATED = re.compile(r"application/vnd\.(?:oci|docker)\.|sha256:\{?SHA256_HEX|sha256:\[0-9a-f\]")


# A version grammar's source text, its fields captured or not, or an idea of naming's written
# out: the .run's name, an LTS stream's key, a kernel banner.
RESTATED_NAMING = re.compile(
    r"""
      \[0-9\]\{3,?\}(?:\(\?:)?\\\.                       # a driver version's branch and its dot
    | \(?\[0-9\]\+\)?\\\.\(?\[0-9\]\+\)?(?:\(\?:|\()?\\\.  # three fields: Flatcar's, a kernel's
    | NVIDIA-Linux-\{ | current-\(\[0-9 | Linux\ version\ \(
    """,
    re.VERBOSE,
)
# The architectures' spellings: Go's, uname -m's, GNU triplets, NVIDIA's redist platform.
ARCH_WORDS = {"amd64", "arm64", "x86_64", "aarch64", "sbsa"}

# Same name, another idea: the driver root's file list (its constants' limits are their own);
# the tooling's branch, naming's as text and a VersionsError.
OTHER_IDEAS = {
    ("entrypoint/src/nvidia_driver/image/manifest.py", "Manifest"),
    ("tooling/gdc/versions.py", "driver_branch"),
}


def _defined(path: Path) -> set[str]:
    """The functions and classes a module defines at its top (media types and the digest's
    grammar, the constants, are found by their text)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}


def _restated(pattern: re.Pattern[str], origin: Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in SOURCES
        if path != origin
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def _arch_word(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        word = node.value.removesuffix("-linux-gnu")
        return word if word in ARCH_WORDS else None
    return None


def _is_arch_table(node: ast.Dict) -> bool:
    """One spelling of an architecture to another, or to names of its own keyed by both
    spellings (naming.ARCH_OF again)."""
    pairs = list(zip(node.keys, node.values, strict=True))
    if any(_arch_word(key) and _arch_word(value) for key, value in pairs):
        return True
    keys = {_arch_word(key) for key in node.keys}
    texts = all(
        isinstance(value, ast.Constant) and isinstance(value.value, str) for value in node.values
    )
    return texts and {"amd64", "x86_64"} <= keys


def arch_tables(source: str) -> list[int]:
    """The lines of the dict literals in source that are architecture tables."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Dict) and _is_arch_table(node)
    ]


def test_oci_media_types_and_digest_grammar_are_written_once() -> None:
    found = _restated(RESTATED, OCI)
    assert not found, "import these from nvidia_driver.formats.oci:\n" + "\n".join(found)


def test_version_grammars_and_file_names_are_written_once() -> None:
    found = _restated(RESTATED_NAMING, NAMING)
    assert not found, "import these from nvidia_driver.naming:\n" + "\n".join(found)


def test_architecture_tables_are_written_once() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in SOURCES
        if path != NAMING
        for line in arch_tables(path.read_text(encoding="utf-8"))
    ]
    assert not found, "architecture tables; import them from nvidia_driver.naming:\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize("module", [OCI, NAMING], ids=["oci", "naming"])
def test_no_module_defines_again_what_the_module_defines(module: Path) -> None:
    # Private helpers are the module's own; a public name defined twice is a second copy.
    public = {name for name in _defined(module) if not name.startswith("_")}
    twice = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in SOURCES
        if path != module
        for name in sorted(_defined(path) & public)
        if (str(path.relative_to(ROOT)), name) not in OTHER_IDEAS
    ]
    where = module.relative_to(ROOT)
    assert not twice, f"defined in {where} already:\n" + "\n".join(twice)


def test_the_scan_sees_a_copy() -> None:
    assert RESTATED.search('INDEX = "application/vnd.oci.image.index.v1+json"')
    assert RESTATED.search('DIGEST = re.compile(f"sha256:{SHA256_HEX.pattern}")')
    assert {"plain_http", "checked_digest", "Manifest"} <= _defined(OCI)


@pytest.mark.parametrize(
    "copy",
    [
        '_VERSION = re.compile(r"[0-9]{3,}\\.[0-9]+(\\.[0-9]+)?")',  # config's driver version
        'AT_END = re.compile(r"[0-9]{3,}(?:\\.[0-9]+){0,2}$")',  # the gate's version or branch
        'RELEASE_VERSION = re.compile(r"[0-9]{3}\\.[0-9]{1,4}\\.[0-9]{1,4}")',  # the tooling's
        '_FLATCAR = re.compile(r"[0-9]+\\.[0-9]+\\.[0-9]+")',
        '_VERSION = re.compile(r"([0-9]+)\\.([0-9]+)\\.([0-9]+)")',
        '_RELEASE = re.compile(r"([0-9]+)\\.([0-9]+)(?:\\.([0-9]+))?")',  # a kernel's version
        'if not re.fullmatch(r"[0-9]+\\.[0-9]+(\\.[0-9]+)?", text):',
        '_LTS_MARKER = re.compile(r"current-([0-9]{4})")',
        'return f"NVIDIA-Linux-{RUN_ARCH[arch]}-{version}.run"',
        '_REAL_BANNER = re.compile(r"Linux version (?P<release>[^\\s%]+) \\(.*\\) #[0-9]+ ")',
    ],
)
def test_the_scan_sees_a_copy_of_a_grammar(copy: str) -> None:
    assert RESTATED_NAMING.search(copy)


@pytest.mark.parametrize(
    "copy",
    [
        'RUN_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}',
        '_MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}',
        'TRIPLET = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}',
        'REDIST_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}',
        # Keyed by both spellings, to names of its own: ARCH_OF again.
        'BOARDS = {"amd64": "amd64-usr", "x86_64": "amd64-usr", "arm64": "a", "aarch64": "a"}',
    ],
)
def test_the_scan_sees_a_copy_of_an_arch_table(copy: str) -> None:
    assert arch_tables(copy)


def test_the_scan_leaves_other_ideas_alone() -> None:
    # ELF machine numbers, kernel config symbols, a compressor's version: not the vocabulary.
    assert not arch_tables('MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183}')
    assert not arch_tables('_CONFIG_SYMBOLS = {"CONFIG_X86_64": "amd64", "CONFIG_ARM64": "arm64"}')
    assert not RESTATED_NAMING.search('_VERSION = re.compile(r"([0-9]+)\\.[0-9]+")')
