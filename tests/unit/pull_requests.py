"""A repository the proposers (invoke propose-drivers, propose-peers) push to: its work tree on
main, pushed to a bare origin beside it, and gh a stub on PATH that logs its calls (gh.log), says
how many pull requests a branch has from gh.prs (none without it), and opens pull request 7."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

URL = "https://github.com/o/gpu-driver-container/pull/7"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def make_repository(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """root's files committed on main and pushed to tmp_path/origin.git; gh stubbed in
    tmp_path/bin (put first on PATH)."""
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "start")
    git(root, "remote", "add", "origin", str(origin))
    git(root, "push", "-q", "origin", "main")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub(
        bin_dir,
        "gh",
        f'printf "%s\\n" "$*" >> {tmp_path / "gh.log"}\n'
        'case "$1 $2" in\n'
        f'  "pr list") cat {tmp_path / "gh.prs"} 2>/dev/null || echo 0;;\n'
        f'  "pr create") echo "{URL}";;\n'
        "esac\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return root
