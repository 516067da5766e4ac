"""The commands the unit tests drive for real, and the Debian/Ubuntu package that brings each.

A test whose command is missing fails, naming the package to install: it is never skipped, so a
green run has run every test (conftest.py also turns any other skip into a failure).
docs/development.md has the one apt-get line for all of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = {
    "gpg": "gnupg",
    "gpgconf": "gnupg",
    "gpgv": "gpgv",
    "openssl": "openssl",
    "patch": "patch",
    "zstd": "zstd",
    "lz4": "lz4",
    "lzop": "lzop",
    "lbzip2": "lbzip2",
    "mkfs.ext4": "e2fsprogs",
    "debugfs": "e2fsprogs",
    "partx": "util-linux",
    "gcc": "gcc",
    "strip": "binutils",
    "readelf": "binutils",
    "nm": "binutils",
}
# mkfs.ext4 and debugfs live in /usr/sbin, which a normal user's PATH on Debian lacks; they run
# unprivileged on image files.
SBIN = ("/usr/sbin", "/sbin")


def add_sbin_to_path() -> None:
    """Put /usr/sbin and /sbin at the end of PATH, where a normal user's Debian PATH lacks them."""
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([*path, *(d for d in SBIN if d not in path)])


def missing_message(*tools: str) -> str:
    """One line: which commands are missing and the apt-get line that installs them; "" if none."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not missing:
        return ""
    packages = " ".join(sorted({PACKAGES[tool] for tool in missing}))
    return f"{', '.join(missing)} not found on PATH: apt-get install {packages}"


def require(*tools: str) -> None:
    """Fail the running test, naming the packages, when any of tools is missing."""
    message = missing_message(*tools)
    if message:
        pytest.fail(message, pytrace=False)


def needs(*tools: str) -> pytest.MarkDecorator:
    """Mark a test that runs tools: conftest.py fails it at setup when one is missing."""
    return pytest.mark.tools(*tools)


def python_m(
    module: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> str:
    """What ``python -m module args`` prints, run by this interpreter; a failure raises."""
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(
        command, capture_output=True, text=True, check=True, cwd=cwd, env=env
    ).stdout
