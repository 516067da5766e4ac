"""CI installs nothing it has not pinned: every Python package by hash, syft by version and digest.

``.ci/run``, the nox sessions and the workflows install from requirements/<group>.txt, hashed
locks of pyproject.toml's dependency groups (``nox -s lock`` re-makes them all), with
--require-hashes; the entrypoint is built from the checkout with the lock's setuptools.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPOSITORY = Path(__file__).resolve().parents[2]
NOXFILE = REPOSITORY / "noxfile.py"
WORKFLOWS = sorted((REPOSITORY / ".github" / "workflows").glob("*.yml"))
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+(?: ;[^\\]*)? \\$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked_groups() -> tuple[str, ...]:
    for node in ast.parse(NOXFILE.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LOCKED_GROUPS":
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError("noxfile.py has no LOCKED_GROUPS")


def _group_names(groups: dict[str, list[Any]], group: str) -> set[str]:
    """The distributions a dependency group asks for, its included groups' too."""
    names = set()
    for entry in groups[group]:
        if isinstance(entry, dict):
            names |= _group_names(groups, entry["include-group"])
        else:
            match = NAME.match(entry)
            assert match, entry
            names.add(_normalized(match.group()))
    return names


def _pins(lock: Path) -> dict[str, int]:
    """Each pinned distribution of a lock and how many hashes it has."""
    pins: dict[str, int] = {}
    current = ""
    for line in lock.read_text().splitlines():
        if match := REQUIREMENT.match(line):
            current = _normalized(match.group(1))
            pins[current] = 0
        elif line.strip().startswith("--hash=sha256:"):
            pins[current] += 1
        else:
            assert not line or line.lstrip().startswith("#"), f"{lock.name}: {line!r}"
    return pins


def test_every_session_lock_pins_its_group_by_hash() -> None:
    groups = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["dependency-groups"]
    for group in _locked_groups():
        lock = REPOSITORY / "requirements" / f"{group}.txt"
        pins = _pins(lock)
        assert pins, lock
        assert all(count > 0 for count in pins.values()), f"{lock.name}: a pin without a hash"
        missing = _group_names(groups, group) - set(pins)
        assert not missing, f"{lock.name} lacks {sorted(missing)}: run nox -s lock"


def _install_calls() -> list[ast.Call]:
    return [
        node
        for node in ast.walk(ast.parse(NOXFILE.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "install"
    ]


def test_the_nox_sessions_install_only_locks_and_the_checkout() -> None:
    calls = _install_calls()
    assert calls
    for call in calls:
        flags = {arg.value for arg in call.args if isinstance(arg, ast.Constant)}
        hashed = {"--require-hashes", "-r"} <= flags
        local = {"--no-deps", "--no-build-isolation"} <= flags and any(
            isinstance(arg, ast.Name) and arg.id == "ENTRYPOINT" for arg in call.args
        )
        assert hashed or local, f"noxfile.py:{call.lineno}: an install neither locked nor local"


def _shell_lines() -> list[tuple[str, str]]:
    lines = [(".ci/run", line) for line in (REPOSITORY / ".ci" / "run").read_text().splitlines()]
    for workflow in WORKFLOWS:
        document = yaml.safe_load(workflow.read_text())
        for job in document["jobs"].values():
            for step in job.get("steps", []):
                lines += [(workflow.name, line) for line in step.get("run", "").splitlines()]
    return lines


def test_ci_and_the_workflows_pip_install_only_by_hash() -> None:
    installs = [(where, line) for where, line in _shell_lines() if "pip install" in line]
    assert any(where == ".ci/run" for where, _ in installs)
    for where, line in installs:
        hashed = "--require-hashes" in line.split() and " -r requirements/" in line
        assert hashed, f"{where}: {line.strip()}"


def test_syft_is_pinned_by_version_and_by_the_digest_invoke_sign_checks() -> None:
    signing = 0
    for workflow in WORKFLOWS:
        document = yaml.safe_load(workflow.read_text())
        for job in document["jobs"].values():
            steps = job.get("steps", [])
            for step in steps:
                if "download-syft" in step.get("uses", ""):
                    assert re.fullmatch(r"v\d+\.\d+\.\d+", step["with"]["syft-version"])
                if "invoke sign" in step.get("run", ""):
                    signing += 1
                    assert '--syft-sha256 "$SYFT_SHA256"' in step["run"], workflow.name
                    assert re.fullmatch(r"[0-9a-f]{64}", step["env"]["SYFT_SHA256"])
                    assert any("download-syft" in other.get("uses", "") for other in steps)
    assert signing == 2  # images.yml and nightly.yml
