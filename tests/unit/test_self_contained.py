"""Nothing the code or the tests read lies outside the repository.

A clone from GitHub has nothing beside it: a fixture that read ``../shared`` (the workplace's
reference data) failed everywhere else with FileNotFoundError. Two checks over every source
and data file of the code, the tests, the benchmarks and the sessions:

- no path into a ``shared`` directory but the repository's own ``tests/shared``;
- no path climbs from ``__file__`` above the repository root: ``Path(__file__).parents[N]``,
  ``.parent`` chains, ``/ ".."``, ``os.path.dirname`` and ``os.path.join``, also through a name
  bound to such a path (``ROOT = ...parents[2]`` then ``ROOT.parent``).

Data copied into the repository says where it comes from (tests/integration/data/README.md).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SCANNED = ("entrypoint", "tooling", "tests", "benchmarks", "images", ".ci", "noxfile.py",
           "tasks.py", "pyproject.toml")  # fmt: skip
SKIPPED_DIRS = {"__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                "build", ".nox"}  # fmt: skip
TEXT_SUFFIXES = {".py", ".toml", ".sh", ".md", ".txt", ".json", ".yml", ".yaml", ".cfg", ".in",
                 ".patch", ""}  # fmt: skip
SHARED = re.compile(r"\bshared(?=/)")  # a directory named shared
ALLOWED_SHARED = "tests/"  # tests/shared: the helpers both test suites import


def _files() -> Iterator[Path]:
    for name in SCANNED:
        top = REPOSITORY / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in candidates:
            relative = path.relative_to(REPOSITORY)
            if SKIPPED_DIRS.intersection(relative.parts[:-1]) or not path.is_file():
                continue
            if path.suffix in TEXT_SUFFIXES and path.stat().st_size < 1 << 20:
                yield path


def shared_paths(text: str) -> list[int]:
    """The line numbers of paths into a ``shared`` directory other than ``tests/shared``."""
    return [
        text.count("\n", 0, match.start()) + 1
        for match in SHARED.finditer(text)
        if not text[: match.start()].endswith(ALLOWED_SHARED)
    ]


class _Climbs:
    """How far above its own file each path expression of a module points (0: the file, 1: its
    directory, ``depth``: the repository root)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.worst: list[tuple[int, int]] = []  # (line, levels above the file)

    def of(self, node: ast.expr) -> int | None:  # noqa: C901, PLR0911 - one case per expression
        match node:
            case ast.Name(id="__file__"):
                return 0
            case ast.Name(id=name):
                return self.names.get(name)
            case ast.Call(func=ast.Attribute(attr="resolve" | "absolute"), args=[]):
                return self.of(node.func.value)  # type: ignore[attr-defined]
            case ast.Call(func=ast.Name(id="Path") | ast.Attribute(attr="Path"), args=[arg]):
                return self.of(arg)
            case ast.Call(func=ast.Attribute(attr="dirname"), args=[arg]):
                return self._step(node, self.of(arg), 1)
            case ast.Call(func=ast.Attribute(attr="abspath" | "realpath"), args=[arg]):
                return self.of(arg)
            case ast.Call(func=ast.Attribute(attr="join"), args=[first, *rest]):
                return self._descend(node, self.of(first), rest)
            case ast.Attribute(attr="parent"):
                return self._step(node, self.of(node.value), 1)
            case ast.Subscript(
                value=ast.Attribute(attr="parents"), slice=ast.Constant(value=int())
            ):
                levels = node.slice.value + 1  # type: ignore[attr-defined]
                return self._step(node, self.of(node.value.value), levels)  # type: ignore[attr-defined]
            case ast.BinOp(op=ast.Div()):
                return self._descend(node, self.of(node.left), [node.right])
        return None

    def _step(self, node: ast.expr, levels: int | None, up: int) -> int | None:
        if levels is None:
            return None
        self.worst.append((node.lineno, levels + up))
        return levels + up

    def _descend(self, node: ast.expr, levels: int | None, parts: list[ast.expr]) -> int | None:
        for part in parts:
            if (
                levels is None
                or not isinstance(part, ast.Constant)
                or not isinstance(part.value, str)
            ):
                return None
            for component in PurePosixPath(part.value).parts:
                levels = self._step(node, levels, 1 if component == ".." else -1)
        return levels


def climbs_out(source: str, depth: int) -> list[int]:
    """The line numbers where a path built from ``__file__`` points above ``depth`` levels."""
    tree = ast.parse(source)
    climbs = _Climbs()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            levels = climbs.of(node.value)
            if isinstance(target, ast.Name) and levels is not None:
                climbs.names[target.id] = levels
    for node in ast.walk(tree):
        if isinstance(node, ast.expr):
            climbs.of(node)
    return sorted({line for line, levels in climbs.worst if levels > depth})


def test_no_path_reaches_outside_the_repository() -> None:
    found = []
    for path in _files():
        relative = path.relative_to(REPOSITORY)
        text = path.read_text(errors="replace")
        found += [
            f"{relative}:{line}: a path into a shared directory" for line in shared_paths(text)
        ]
        if path.suffix == ".py":
            depth = len(relative.parts)
            found += [
                f"{relative}:{line}: a path above the repository"
                for line in climbs_out(text, depth)
            ]
    assert not found, "copy what the tests need into the repository:\n" + "\n".join(found)


def test_the_scan_covers_the_fixtures() -> None:
    scanned = {path.relative_to(REPOSITORY).as_posix() for path in _files()}
    assert "tests/integration/fixtures/gcc15_kernel.py" in scanned
    assert "noxfile.py" in scanned
    assert ".ci/run" in scanned


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("ROOT = Path(__file__).resolve().parents[2]\n", []),
        ("ROOT = Path(__file__).resolve().parents[3]\n", [1]),
        ("ROOT = Path(__file__).parents[2]\nDATA = ROOT.parent / 'shared'\n", [2]),
        ("DATA = Path(__file__).parent.parent.parent.parent\n", [1]),
        ("DATA = Path(__file__).parents[1] / '..' / '..' / 'x'\n", [1]),
        ("DATA = Path(__file__).parents[1] / '../..'\n", [1]),
        ("DATA = Path(__file__).parents[1] / 'data' / '..' / '..'\n", []),
        ("DATA = os.path.join(os.path.dirname(__file__), '..', '..', '..')\n", [1]),
        ("DATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n", []),
        ("LINK = Path('../../etc/passwd')\n", []),  # not from __file__: a symlink target
    ],
)
def test_climbs_are_measured_from_the_file(source: str, lines: list[int]) -> None:
    assert climbs_out(source, depth=3) == lines


# The examples name the directory through NAME, so that grep for its paths finds only real ones.
NAME = "shared"


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (f"from tests/{NAME}/flatcar_feed.py\n", []),
        (f"pythonpath = ['tests/{NAME}']\n", []),
        (f"read ../{NAME}/data/x\n", [1]),
        (f"ok\n{NAME}/reference/nvidia.md\n", [2]),
        (f"un{NAME}/ is a word\n", []),
    ],
)
def test_shared_paths_outside_tests_are_found(text: str, lines: list[int]) -> None:
    assert shared_paths(text) == lines
