"""compilers.py: which gcc built each Flatcar release line's kernel, the one record of it."""

from __future__ import annotations

import re
from pathlib import Path

from tools import python_m

from gdc import compilers

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "building.md"
DOCKERFILE = ROOT / "images" / "build" / "Dockerfile"
BEGIN = (
    "<!-- BEGIN gcc table: made by `PYTHONPATH=tooling python -m gdc.compilers --markdown`; "
    "edit tooling/gdc/compilers.py -->"
)
END = "<!-- END gcc table -->"


def test_the_docs_carry_the_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1, f"{DOCS.name} lost its {BEGIN!r} mark"
    assert text.count(END) == 1, f"{DOCS.name} lost its {END!r} mark"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == compilers.markdown(), (
        "docs/building.md's gcc table is stale: replace it with the output of "
        "`PYTHONPATH=tooling python -m gdc.compilers --markdown`"
    )


def test_the_build_image_installs_one_gcc_per_line_and_no_other() -> None:
    """The Dockerfile's apt-get installs gcc-<major> for exactly the table's majors."""
    commands = [
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    installed = sorted({int(major) for major in re.findall(r"\bgcc-(\d+)\b", "\n".join(commands))})
    assert installed == sorted(compilers.majors())
    assert len(set(compilers.majors())) == len(compilers.LINES)


def test_the_command_prints_the_table() -> None:
    output = python_m(
        "gdc.compilers", "--markdown", cwd=ROOT, env={"PYTHONPATH": str(ROOT / "tooling")}
    )
    assert output == compilers.markdown()
    plain = compilers.text()
    assert "`" not in plain
    assert all(f"gcc-{major}" in plain for major in compilers.majors())
