"""benchmarks/record.py: each script rewrites only its own section of docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from record import Report


def test_a_section_names_its_command_date_commit_and_machine(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    with Report("cli_startup", record=True, argv=["benchmarks/cli_startup.py", "40"], docs=docs):
        print("ratio --help / bare start:   1.09")
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n")
    assert "- command: `python benchmarks/cli_startup.py 40`" in text
    assert "- date: " in text
    assert "- commit: " in text
    assert "- machine: " in text
    assert " cores" in text
    assert "ratio --help / bare start:   1.09" in text


def test_a_rerun_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    for name, figure in (("first", "1.00"), ("second", "2.00"), ("first", "3.00")):
        with Report(name, record=True, argv=[f"benchmarks/{name}.py"], docs=docs):
            print(f"ratio {figure}")
    text = docs.read_text()
    assert text.count("## first") == 1
    assert "ratio 3.00" in text
    assert "ratio 1.00" not in text
    assert "ratio 2.00" in text
    assert text.index("## first") < text.index("## second")


def test_without_record_it_only_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "benchmarks.md"
    with Report("cli_startup", record=False, argv=["benchmarks/cli_startup.py"], docs=docs):
        print("figure")
    assert not docs.exists()
    assert capsys.readouterr().out == "figure\n"


def test_a_failed_run_records_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    report = Report("cli_startup", record=True, argv=["benchmarks/cli_startup.py"], docs=docs)
    stdout = sys.stdout

    def fail_halfway() -> None:
        with report:
            print("half a figure")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fail_halfway()
    assert not docs.exists()
    assert sys.stdout is stdout


def test_a_name_that_would_break_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="not"):
        Report("x -->", record=True, argv=["x.py"])


def test_a_run_of_an_earlier_clone_records_the_clones_commit(tmp_path: Path) -> None:
    """ci_run.py measures a clone made before the run: commits made meanwhile are not in it."""
    docs = tmp_path / "benchmarks.md"
    report = Report("ci_run", record=True, argv=["benchmarks/ci_run.py"], docs=docs,
                    measured="79be56e2436e")  # fmt: skip
    with report:
        print("exit 0")
    assert "- commit: 79be56e2436e\n" in docs.read_text()
