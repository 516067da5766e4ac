from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from synthetic_patch import synthetic_patch
from tools import needs

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.patches import (
    PATCH_DIR,
    apply_patches,
    load_index,
    select_patches,
    shipped_patches,
)
from nvidia_driver.naming import KernelVersion, parse_kernel_release

PCI_RESIZE = "pci-resize-resource-exclude-bars"
needs_patch_tool = needs("patch")


@pytest.mark.parametrize(
    ("release", "version"),
    [
        ("6.12.117+deb12-cloud-amd64", (6, 12, 117)),
        ("6.12.81-flatcar", (6, 12, 81)),
        ("6.6.95-flatcar", (6, 6, 95)),
        ("6.13", (6, 13, 0)),
        ("7.0.0-rc1", (7, 0, 0)),
        (" 6.12.97\n", (6, 12, 97)),
    ],
)
def test_parse_kernel_release(release: str, version: tuple[int, int, int]) -> None:
    assert parse_kernel_release(release) == KernelVersion(*version)


@pytest.mark.parametrize("release", ["", "flatcar", "v6.12.97", "6"])
def test_parse_kernel_release_rejects_garbage(release: str) -> None:
    with pytest.raises(DriverError, match="cannot read a kernel version"):
        parse_kernel_release(release)


@pytest.mark.parametrize("branch", [535, 550, 570])
@pytest.mark.parametrize(
    "release", ["6.12.97-flatcar", "6.12.117+deb12-cloud-amd64", "6.13.1", "6.18.2", "7.0.0"]
)
def test_old_branches_get_the_pci_resize_fix_from_6_12_97(branch: int, release: str) -> None:
    selected = select_patches(branch, release, "kernel-open")
    assert [patch.name for patch in selected] == [PCI_RESIZE]
    assert selected[0].path == PATCH_DIR / str(branch) / f"{PCI_RESIZE}.patch"


@pytest.mark.parametrize("branch", [535, 550, 570])
@pytest.mark.parametrize(
    "release", ["6.12.96-flatcar", "6.12.81-flatcar", "6.12.0", "6.6.100-flatcar", "5.15.0-1"]
)
def test_no_patch_below_6_12_97(branch: int, release: str) -> None:
    assert select_patches(branch, release, "kernel-open") == []


@pytest.mark.parametrize("branch", [535, 550, 570])
def test_proprietary_tree_needs_no_pci_resize_fix(branch: int) -> None:
    assert select_patches(branch, "6.12.117+deb12-cloud-amd64", "kernel") == []


@pytest.mark.parametrize("branch", [470, 560, 565, 580, 590, 595])
def test_other_branches_get_nothing(branch: int) -> None:
    for tree in ("kernel-open", "kernel"):
        assert select_patches(branch, "6.12.117-flatcar", tree) == []


def test_select_patches_rejects_a_module_type_name() -> None:
    with pytest.raises(ValueError, match="module_type_dir"):
        select_patches(535, "6.12.97", "open")


def test_shipped_index_lists_every_patch_file_once() -> None:
    listed = sorted(patch.path for patch in shipped_patches())
    assert listed == sorted(PATCH_DIR.glob("*/*.patch"))
    assert len(set(listed)) == len(listed)


def test_shipped_patches_live_under_their_branch() -> None:
    for patch in shipped_patches():
        assert int(patch.path.parent.name) in patch.branches
        assert patch.reason.strip() == patch.reason
        assert "\n" not in patch.reason


def test_shipped_patches_are_p1_diffs_inside_one_tree() -> None:
    for patch in shipped_patches():
        text = patch.path.read_text()
        old = re.findall(r"^--- (\S+)", text, re.MULTILINE)
        new = re.findall(r"^\+\+\+ (\S+)", text, re.MULTILINE)
        assert old, patch.path
        assert [name.removeprefix("a/") for name in old] == [
            name.removeprefix("b/") for name in new
        ]
        for name in old + new:
            assert re.fullmatch(r"[ab]/[\w./-]+", name), name
            assert not name[2:].startswith(("kernel-open/", "kernel/")), name
            assert ".." not in name, name


def test_shipped_pci_resize_patches_add_the_conftest_and_guard_the_call() -> None:
    for patch in shipped_patches():
        if patch.name != PCI_RESIZE:
            continue
        text = patch.path.read_text()
        assert "+        pci_resize_resource_has_exclude_bars_arg)" in text
        assert "+NV_CONFTEST_TYPE_COMPILE_TESTS += pci_resize_resource_has_exclude_bars_arg" in text
        assert "+#if defined(NV_PCI_RESIZE_RESOURCE_HAS_EXCLUDE_BARS_ARG)" in text


def _write_index(directory: Path, **changes: object) -> Path:
    (directory / "999").mkdir(parents=True, exist_ok=True)
    (directory / "999" / "demo.patch").write_text("")
    entry: dict[str, object] = {
        "name": "demo",
        "file": "999/demo.patch",
        "branches": [999],
        "min_kernel": "6.1",
        "max_kernel": "6.6.50",
        "trees": ["kernel-open", "kernel"],
        "reason": "demonstration",
        "note": "synthetic",
    }
    entry.update(changes)
    (directory / "index.json").write_text(json.dumps({"format": 1, "patches": [entry]}))
    return directory


def test_max_kernel_is_exclusive(tmp_path: Path) -> None:
    (patch,) = load_index(_write_index(tmp_path))
    assert patch.applies_to(999, parse_kernel_release("6.1.0"), "kernel")
    assert patch.applies_to(999, parse_kernel_release("6.6.49-flatcar"), "kernel-open")
    assert not patch.applies_to(999, parse_kernel_release("6.6.50-flatcar"), "kernel-open")
    assert not patch.applies_to(999, parse_kernel_release("6.0.19"), "kernel-open")
    assert not patch.applies_to(998, parse_kernel_release("6.2"), "kernel-open")


@pytest.mark.parametrize(
    "changes",
    [
        {"branches": []},
        {"branches": ["535"]},
        {"trees": ["open"]},
        {"trees": []},
        {"min_kernel": "6.12.97-flatcar"},
        {"max_kernel": "6.0"},
        {"reason": ""},
        {"file": "999/missing.patch"},
        {"extra": True},
    ],
)
def test_malformed_index_is_reported(tmp_path: Path, changes: dict[str, object]) -> None:
    with pytest.raises(DriverError, match="is malformed"):
        load_index(_write_index(tmp_path, **changes))


def test_missing_index_is_reported(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="is malformed"):
        load_index(tmp_path)


ORIGINAL = "int answer(void)\n{\n    return 41;\n}\n"
PATCHED = "int answer(void)\n{\n    return 42;\n}\n"
DIFF = """\
A synthetic patch: its header text is ignored by patch(1).

--- a/src/answer.c
+++ b/src/answer.c
@@ -1,4 +1,4 @@
 int answer(void)
 {
-    return 41;
+    return 42;
 }
"""
BROKEN_SECOND_FILE = """\
--- a/other.c
+++ b/other.c
@@ -1,1 +1,1 @@
-this line is not there
+replacement
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    source = tmp_path / "kernel-open"
    (source / "src").mkdir(parents=True)
    (source / "src" / "answer.c").write_text(ORIGINAL)
    (source / "other.c").write_text("something else\n")
    return source


@needs_patch_tool
def test_apply_patches_patches_the_tree_and_says_so(
    tmp_path: Path, tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apply_patches([synthetic_patch(tmp_path, DIFF)], tree, Commands())
    assert (tree / "src" / "answer.c").read_text() == PATCHED
    assert capsys.readouterr().out == "Applying patch demo: the answer is 42\n"


@needs_patch_tool
def test_an_already_applied_patch_is_an_error(tmp_path: Path, tree: Path) -> None:
    patch = synthetic_patch(tmp_path, DIFF)
    apply_patches([patch], tree, Commands())
    with pytest.raises(DriverError, match=r"patch demo .* does not apply .*Reversed"):
        apply_patches([patch], tree, Commands())
    assert (tree / "src" / "answer.c").read_text() == PATCHED


@needs_patch_tool
def test_a_patch_that_does_not_apply_whole_changes_nothing(tmp_path: Path, tree: Path) -> None:
    patch = synthetic_patch(tmp_path, DIFF + BROKEN_SECOND_FILE)
    with pytest.raises(DriverError) as caught:
        apply_patches([patch], tree, Commands())
    message = str(caught.value)
    assert "\n" not in message
    assert f"does not apply to the driver sources in {tree}" in message
    assert "FAILED" in message
    assert (tree / "src" / "answer.c").read_text() == ORIGINAL
    assert not list(tree.rglob("*.rej"))
    assert not list(tree.rglob("*.orig"))


def test_apply_patches_without_patch_tool_names_the_tool(tmp_path: Path, tree: Path) -> None:
    commands = Commands(env={"PATH": str(tmp_path / "empty")})
    with pytest.raises(DriverError, match="patch not found on PATH"):
        apply_patches([synthetic_patch(tmp_path, DIFF)], tree, commands)
