"""tools.py: a missing command names the package that brings it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tools import add_sbin_to_path, missing_message


def test_a_missing_command_names_its_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert missing_message("gpg", "gpgconf", "mkfs.ext4") == (
        "gpg, gpgconf, mkfs.ext4 not found on PATH: apt-get install e2fsprogs gnupg"
    )


def test_nothing_is_said_when_every_command_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "zstd").write_text("#!/bin/sh\n")
    (tmp_path / "zstd").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert missing_message("zstd") == ""


def test_sbin_joins_the_end_of_path_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/sbin")
    add_sbin_to_path()
    add_sbin_to_path()
    assert os.environ["PATH"] == "/usr/bin:/sbin:/usr/sbin"
