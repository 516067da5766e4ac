"""The workflows' shell steps fail when a command in them fails, as GitHub runs them.

GitHub runs a ``shell: bash`` step as ``bash --noprofile --norc -eo pipefail {0}``. Each step
is run that way here with stub commands on PATH, ``invoke matrix`` failing: a step that calls
it must fail too (``echo "json=$(invoke matrix --json)"`` would not).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOWS = sorted((Path(__file__).parents[3] / ".github" / "workflows").glob("*.yml"))
STUBS = {
    "invoke": 'if [ "$1" = matrix ]; then echo "matrix failed" >&2; exit 1; fi\n',
    "python": "exit 0\n",
    "apt-get": "exit 0\n",
}
EXPRESSION = re.compile(r"\$\{\{.*?\}\}")


def _steps() -> list[tuple[str, str, str]]:
    found = []
    for workflow in WORKFLOWS:
        document: dict[str, Any] = yaml.safe_load(workflow.read_text())
        for job_name, job in document["jobs"].items():
            for number, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    name = f"{workflow.name}:{job_name}:{step.get('name', number)}"
                    found.append((name, step["run"], job.get("defaults", {}).get("shell", "")))
    return found


def _stub_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return f"{bin_dir}:/usr/bin:/bin"


def test_every_workflow_runs_its_steps_in_bash() -> None:
    for workflow in WORKFLOWS:
        document = yaml.safe_load(workflow.read_text())
        assert document["defaults"]["run"]["shell"] == "bash", workflow.name


def test_no_command_substitution_hides_a_failure() -> None:
    for name, script, _ in _steps():
        assert "$(invoke" not in script, name
        assert "`invoke" not in script, name


MATRIX_STEPS = [(name, script) for name, script, _ in _steps() if "invoke matrix" in script]


def test_the_publishing_workflows_compute_their_matrix() -> None:
    assert {name.split(":")[0] for name, _ in MATRIX_STEPS} == {"images.yml", "nightly.yml"}


@pytest.mark.parametrize(("name", "script"), MATRIX_STEPS, ids=[n for n, _ in MATRIX_STEPS])
def test_a_failing_invoke_matrix_fails_its_step(tmp_path: Path, name: str, script: str) -> None:
    output = tmp_path / "github-output"
    env = {**os.environ, "PATH": _stub_path(tmp_path), "GITHUB_OUTPUT": str(output)}
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c",
         EXPRESSION.sub("x", script)],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode != 0, f"{name} passed although invoke matrix failed"
    assert "matrix failed" in result.stderr
    assert not output.exists() or "json=" not in output.read_text()


def _document(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((WORKFLOWS[0].parent / name).read_text()))


def test_the_nightly_runs_one_at_a_time_queued_not_cancelled() -> None:
    """Two nightly runs must never stage or merge at once: one workflow-level group for all."""
    document = _document("nightly.yml")
    concurrency = document.get("concurrency")
    assert isinstance(concurrency, dict), "nightly.yml needs a workflow-level concurrency group"
    assert concurrency.get("cancel-in-progress") is False  # queue: a cancelled merge half-tags
    group = str(concurrency.get("group", ""))
    # The same group for every run: a run id, a ref or a SHA in it would let two runs overlap.
    assert group, "the concurrency group is empty"
    for varying in ("run_id", "run_number", "run_attempt", "github.ref", "github.sha",
                    "github.event"):  # fmt: skip
        assert varying not in group, f"{group!r} differs between runs ({varying})"
    # A job in the workflow's own group would wait for its own run forever.
    for name, job in document["jobs"].items():
        job_group = (job.get("concurrency") or {}).get("group", "")
        assert job_group != group, f"job {name} takes the workflow's group {group!r}"
