"""Sessions for gpu-driver-container (Python >= 3.11; docs/development.md).

A bare ``nox`` runs lint, typecheck and tests (the unit tests: no root, no network, no Docker).
``nox -s integration integration_arm64`` runs the integration tests; they need root on Debian 12.
Every session installs from its hashed lock, requirements/<session>.txt (``nox -s lock``).
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.needs_version = ">=2025.5.1"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "typecheck", "tests"]

ENTRYPOINT = "./entrypoint"
WORKFLOWS = Path(".github/workflows")
REQUIREMENTS = Path("requirements")
# pyproject.toml's dependency groups that have a lock, requirements/<group>.txt: one per session
# (the lock session uses nox's, which has uv), what .ci/run starts from (nox, pip), and what the
# publishing workflows install (pip, tasks).
LOCKED_GROUPS = ("nox", "pip", "lint", "typecheck", "tests", "integration", "tasks")


def _install(session: nox.Session, lock: str, *, entrypoint: bool = False,
             editable: bool = False) -> None:  # fmt: skip
    """Install requirements/<lock>.txt by hash, then the entrypoint if asked, built with the
    lock's setuptools (no build isolation: nothing is fetched to build it)."""
    session.install("--require-hashes", "-r", str(REQUIREMENTS / f"{lock}.txt"))
    if entrypoint:
        session.install("--no-deps", "--no-build-isolation", *(["-e"] * editable), ENTRYPOINT)


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff (linter, format check) and check the workflows (schema, zizmor, actionlint)."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    workflows = sorted(str(path) for path in WORKFLOWS.glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("zizmor", "--offline", "--no-progress", str(WORKFLOWS))
    # The run: scripts are not handed to shellcheck or pyflakes, whichever a machine has: the
    # same checks everywhere.
    session.run("actionlint", "-shellcheck=", "-pyflakes=", *workflows)


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check the entrypoint, the tooling, tasks.py and noxfile.py with mypy --strict."""
    _install(session, "typecheck", entrypoint=True, editable=True)
    session.run("mypy", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the unit tests against simulated hosts."""
    # With the tasks' own imports (docker SDK, requests): tasks.py and the tooling are tested in
    # place.
    _install(session, "tests", entrypoint=True)
    # Two workers: the suite waits on gpg, servers and subprocesses more than it computes.
    session.run("pytest", "-n", "2", "tests/unit", *session.posargs)


@nox.session(default=False)
def lock(session: nox.Session) -> None:
    """Re-make requirements/*.txt from pyproject.toml's groups: the newest versions, hashed."""
    _install(session, "nox")  # uv, by hash
    for group in LOCKED_GROUPS:
        session.run("uv", "pip", "compile", "--generate-hashes", "--universal", "--upgrade",
                    "--python-version", "3.11", "--no-header", "--group", f"pyproject.toml:{group}",
                    "-o", str(REQUIREMENTS / f"{group}.txt"))  # fmt: skip


def _integration(session: nox.Session, markers: str) -> None:
    _install(session, "integration", entrypoint=True)
    # --durations: what each fixture and test costs, to keep CI within its time budget. Test
    # paths given (tests/integration/test_x.py::name) replace the directory, or pytest would
    # collect both and run the whole suite.
    named = any(arg.startswith("tests/") for arg in session.posargs)
    session.run("pytest", *([] if named else ["tests/integration"]), "-m", markers,
                "--durations=25", *session.posargs)  # fmt: skip


@nox.session(default=False)
def integration(session: nox.Session) -> None:
    """Run the integration tests (root, Docker and Debian's package registry needed)."""
    _integration(session, "integration and not arm64")


@nox.session(default=False)
def integration_arm64(session: nox.Session) -> None:
    """The arm64 driver (root): the cross build and its load into arm64 Linux under
    qemu-system-aarch64 (a compile of many minutes with the cross gcc), and the aarch64 .run's
    userspace under qemu-user. Kept out of the main session's budget: .ci/run runs it beside it."""
    _integration(session, "integration and arm64")


@nox.session(default=False)
def cluster(session: nox.Session) -> None:
    """The real systems in the loop (root, Go 1.26): etcd, kube-apiserver, the GPU Operator, FLUO
    and kured, built from the Go modules tests/integration/cluster/peers.toml pins, and the
    scenarios that run our images and the reboot gate against them."""
    _install(session, "integration", entrypoint=True)
    named = any(arg.startswith("tests/") for arg in session.posargs)
    session.run("pytest", *([] if named else ["tests/integration/cluster"]), "-m", "cluster",
                "--durations=15", *session.posargs)  # fmt: skip


@nox.session(default=False)
def tests_python314(session: nox.Session) -> None:
    """The unit tests on the images' Python, Debian forky's 3.14, in a forky root with the unit
    tests' commands (root): tests/integration/python314.py. Arguments go to pytest."""
    _install(session, "integration")
    session.run("python", "tests/integration/python314.py", *session.posargs)


if __name__ == "__main__":
    nox.main()
