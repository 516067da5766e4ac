"""The package's folders are its architecture: imports run one way, from the command line down.

    cli, __main__     the command line
    node/, image/     the driver on a node; the image build (neither imports the other)
    gate/             the reboot gate (imports neither node/ nor image/)
    kbuild/           kernel trees and their providers, compiler, patches, make, packages, pipeline
    sources/          Flatcar's release facts and server, verified downloads, NVIDIA's redist
    formats/          bounded readers: tar streams, ELF, kernel images, a registry's
                      OCI answers (oci: the gate and the tooling both read them there)
    the rest          errors, log, limits, links, atomic, digests, commands, paths, config,
                      settings, safetext, naming (arch names, NVIDIA's file names, version
                      grammars; the tooling imports it too): used by all

A module may import what is in its own folder or below it, never above it or beside it, and no
module reaches itself again through its imports, inside a folder either (a cycle: what both
need belongs in a module both import). Every import counts, also those inside functions (the
command line imports lazily). The source tree is read, not the installed package; the tooling
(tooling/gdc, one folder) is checked for cycles too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PACKAGE = "nvidia_driver"
SOURCE = Path(__file__).resolve().parents[2] / "entrypoint" / "src" / PACKAGE
# The tooling behind tasks.py: one folder, so only cycles concern it.
TOOLING = Path(__file__).resolve().parents[2] / "tooling" / "gdc"
BASE = "the top-level modules"
# Each layer, and the layers it may import from (besides its own).
LAYERS = {
    BASE: (),
    "formats": (BASE,),
    "sources": ("formats", BASE),
    "kbuild": ("sources", "formats", BASE),
    "node": ("kbuild", "sources", "formats", BASE),
    "image": ("kbuild", "sources", "formats", BASE),
    "gate": ("kbuild", "sources", "formats", BASE),
    "cli": ("node", "image", "gate", "kbuild", "sources", "formats", BASE),
}
ENTRY_MODULES = {"cli", "__main__"}
MAX_LINES = 600
MAX_TASKS_LINES = 250  # tasks.py: thin wrappers over tooling/gdc (issue 38)


def module_name(path: Path, source: Path = SOURCE) -> str:
    parts = path.relative_to(source.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of nvidia_driver[.folder][.module]: its folder, the command line or the base."""
    parts = module.split(".")
    if len(parts) == 1:
        return BASE  # the package itself: __init__.py
    if (SOURCE / parts[1]).is_dir():
        return parts[1]
    return "cli" if parts[1] in ENTRY_MODULES else BASE


def modules(source: Path = SOURCE) -> list[Path]:
    return sorted(source.rglob("*.py"))


def imported(path: Path, source: Path = SOURCE) -> Iterator[tuple[int, str]]:
    """(line, module) for every module path imports, wherever the import is."""
    name = module_name(path, source)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            yield node.lineno, origin
            # from nvidia_driver.kbuild import container: the module container, too.
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                as_path = source.parent.joinpath(*candidate.split("."))
                if as_path.with_suffix(".py").is_file() or as_path.is_dir():
                    yield node.lineno, candidate


def edges(source: Path = SOURCE) -> list[tuple[str, int, str]]:
    """(importer, line, imported) for every import of a package module by a package module."""
    found = []
    for path in modules(source):
        for line, target in imported(path, source):
            if target == source.name or target.startswith(f"{source.name}."):
                found.append((module_name(path, source), line, target))
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def import_cycles(found: Iterable[tuple[str, int, str]]) -> list[list[str]]:
    """Each group of modules that reach one another through their imports, sorted."""
    graph: dict[str, set[str]] = {}
    for importer, _, target in found:
        graph.setdefault(importer, set()).add(target)
    reach = {module: _reachable(graph, module) for module in graph}
    groups = {
        tuple(sorted(other for other in reach if other in reach[module] and module in reach[other]))
        for module in reach
        if module in reach[module]
    }
    return sorted(list(group) for group in groups)


def test_every_folder_has_a_place_in_the_order() -> None:
    folders = {path.name for path in SOURCE.iterdir() if path.is_dir()} - {"__pycache__"}
    assert folders <= set(LAYERS), f"give {sorted(folders - set(LAYERS))} a place in LAYERS"
    assert all((SOURCE / folder / "__init__.py").is_file() for folder in folders)


def test_the_import_reader_sees_every_kind_of_import() -> None:
    found = {(importer, target) for importer, _, target in edges()}
    # A lazy import inside a function, a module imported from a folder, a plain from-import.
    assert ("nvidia_driver.cli", "nvidia_driver.node.lifecycle") in found
    assert ("nvidia_driver.formats.tar", "nvidia_driver.formats.output") in found
    assert ("nvidia_driver.kbuild.pipeline", "nvidia_driver.kbuild.release") in found


def test_imports_run_one_way() -> None:
    wrong = []
    for importer, line, target in edges():
        source, destination = layer_of(importer), layer_of(target)
        if destination != source and destination not in LAYERS[source]:
            wrong.append(f"{importer}:{line} imports {target} ({source} -> {destination})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source", [SOURCE, TOOLING], ids=["entrypoint", "tooling"])
def test_no_module_reaches_itself_through_its_imports(source: Path) -> None:
    cycles = import_cycles(edges(source))
    assert not cycles, "import cycles (move what both need into a module both import):\n" + (
        "\n".join(" <-> ".join(cycle) for cycle in cycles)
    )


def test_a_cycle_inside_one_folder_is_caught(tmp_path: Path) -> None:
    # The one lifecycle.py and peermem.py had: a plain import one way, a lazy one back.
    source = tmp_path / PACKAGE
    (source / "node").mkdir(parents=True)
    for init in (source / "__init__.py", source / "node" / "__init__.py"):
        init.write_text("")
    (source / "node" / "lifecycle.py").write_text("from nvidia_driver.node import peermem\n")
    (source / "node" / "peermem.py").write_text(
        "def reload() -> None:\n    from nvidia_driver.node.lifecycle import wait  # noqa\n"
    )
    (source / "node" / "status.py").write_text("from nvidia_driver.node.lifecycle import run\n")
    # Both sit in one folder, so the layer order has nothing against them.
    assert {layer_of(importer) for importer, _, _ in edges(source)} == {"node"}
    assert import_cycles(edges(source)) == [
        ["nvidia_driver.node.lifecycle", "nvidia_driver.node.peermem"]
    ]


def test_formats_and_sources_know_nothing_of_builds_nodes_or_images() -> None:
    above = {"kbuild", "node", "image", "cli"}
    wrong = [
        f"{importer}:{line} imports {target}"
        for importer, line, target in edges()
        if layer_of(importer) in {"formats", "sources"} and layer_of(target) in above
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(SOURCE)): lines
        for path in modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules (lines): {long}"


def test_tasks_py_stays_thin() -> None:
    """tasks.py is signatures, docstrings and one call each; the logic is tooling/gdc's."""
    tasks_py = SOURCE.parents[2] / "tasks.py"
    lines = len(tasks_py.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_TASKS_LINES, f"tasks.py has {lines} lines: move logic to tooling/gdc"
