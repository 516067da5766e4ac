"""invoke sign: cosign and syft command lines, run as stubs on PATH, and a loopback registry."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tasks
from flatcar_feed import feed_from_tsv
from invoke.context import MockContext
from invoke.exceptions import Exit
from oci_registry import OCIRegistry

from gdc import sign

SUM = "ab" * 32
NAME = "gdc/driver"
STUB = """#!/bin/sh
echo "${0##*/} $*" >> "$STUB_LOG"
case "$*" in *spdx-json=*) echo '{"spdxVersion": "SPDX-2.3"}' > "${*##*spdx-json=}";; esac
exit "${STUB_EXIT:-0}"
"""


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as server:
        yield server


@pytest.fixture
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cosign and syft on an otherwise empty PATH; returns the log of their command lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("cosign", "syft"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "env").symlink_to(shutil.which("env") or "/usr/bin/env")  # syft's http setting
    log = tmp_path / "commands.log"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("STUB_LOG", str(log))
    return log


def _files(tmp_path: Path) -> tuple[str, str]:
    versions = tmp_path / "versions.toml"
    versions.write_text(f'[images]\nchannels = ["stable"]\narches = ["amd64", "arm64"]\n'
                        f'[drivers."610.57.04"]\nsha256 = {{ amd64 = "{SUM}" }}\n')  # fmt: skip
    feed = tmp_path / "releases.json"
    feed.write_text(json.dumps(feed_from_tsv()))
    return str(versions), feed.as_uri()


def _commands(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_each_published_digest_is_signed_and_attested_once(
    registry: OCIRegistry, stubs: Path, tmp_path: Path, capsys: Any
) -> None:
    build = registry.add_image(NAME, ["610.57.04-flatcar", "610.57.04-flatcar-flatcar4593.2.5"],
                               ("amd64", "arm64"))  # fmt: skip
    versions, feed = _files(tmp_path)
    tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
               releases_url=feed, key="cosign.key")  # fmt: skip
    reference = f"{registry.host}/{NAME}@{build}"
    [sign_line, syft_line, attest_line] = _commands(stubs)
    assert sign_line == f"cosign sign --yes --key cosign.key --allow-http-registry {reference}"
    assert syft_line.startswith(f"syft scan registry:{reference} -o spdx-json=/")
    # syft reads "use http" from its environment: the runner runs `env VAR=true syft ...`
    predicate = syft_line.rpartition("spdx-json=")[2]
    assert attest_line == (
        "cosign attest --yes --key cosign.key --allow-http-registry --type spdxjson "
        f"--predicate {predicate} {reference}"
    )
    out = capsys.readouterr().out
    assert "signed   610.57.04-flatcar" in out
    assert "skipped  610.57.04-flatcar4593.2.5  -" in out
    assert out.splitlines()[-1] == "signed 1, skipped 1"


def test_what_is_signed_already_is_skipped(
    registry: OCIRegistry, stubs: Path, tmp_path: Path, capsys: Any
) -> None:
    build = registry.add_image(NAME, ["610.57.04-flatcar"])
    for suffix in (".sig", ".att"):
        registry.add_image(NAME, [build.replace(":", "-") + suffix])
    versions, feed = _files(tmp_path)
    tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
               releases_url=feed)  # fmt: skip
    assert _commands(stubs) == []
    assert "already signed and attested" in capsys.readouterr().out


def test_signer_command_lines_for_a_tls_registry_and_keyless() -> None:
    signer = sign.Signer(sign.Repository("ghcr.io", "me/driver"))
    reference = "ghcr.io/me/driver@sha256:" + "1" * 64
    assert signer.sign_argv(reference) == ["cosign", "sign", "--yes", reference]
    assert signer.sbom_argv(reference, Path("/tmp/s.json")) == [
        "syft", "scan", f"registry:{reference}", "-o", "spdx-json=/tmp/s.json"]  # fmt: skip
    assert signer.attest_argv(reference, Path("/tmp/s.json")) == [
        "cosign", "attest", "--yes", "--type", "spdxjson", "--predicate", "/tmp/s.json",
        reference]  # fmt: skip


def test_without_syft_only_signatures(
    registry: OCIRegistry, stubs: Path, tmp_path: Path, capsys: Any
) -> None:
    (stubs.parent / "bin" / "syft").unlink()
    registry.add_image(NAME, ["610.57.04-flatcar"])
    versions, feed = _files(tmp_path)
    tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
               releases_url=feed)  # fmt: skip
    assert [line.split()[:2] for line in _commands(stubs)] == [["cosign", "sign"]]
    assert sign.NO_SYFT in capsys.readouterr().out


def test_a_failing_cosign_fails_the_task_after_trying_everything(
    registry: OCIRegistry, stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("STUB_EXIT", "1")
    registry.add_image(NAME, ["610.57.04-flatcar"], label="build")
    registry.add_image(NAME, ["610.57.04-flatcar4593.2.5"], label="precompiled")
    versions, feed = _files(tmp_path)
    with pytest.raises(Exit, match=r"invoke sign: 2 of 2 images failed"):
        tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
                   releases_url=feed, sbom=False)  # fmt: skip
    assert len(_commands(stubs)) == 2
    out = capsys.readouterr().out
    assert "failed  610.57.04-flatcar " in out
    assert "cosign sign exited 1: see its output above" in out


def test_without_cosign_a_clear_line_and_nothing_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    tasks.sign(MockContext(), registry="ghcr.io/me")
    assert capsys.readouterr().out == f"invoke sign: {sign.NO_COSIGN}\n"
    assert "\n" not in sign.NO_COSIGN
    with pytest.raises(Exit, match="cosign is not on PATH: nothing signed"):
        tasks.sign(MockContext(), registry="ghcr.io/me", require_cosign=True)


def _stub_sha256(stubs: Path) -> str:
    return hashlib.sha256((stubs.parent / "bin" / "syft").read_bytes()).hexdigest()


def test_a_pinned_syft_runs_by_the_path_that_was_checked(
    registry: OCIRegistry, stubs: Path, tmp_path: Path
) -> None:
    assert sign.pinned_syft(_stub_sha256(stubs)) == str((stubs.parent / "bin" / "syft").resolve())
    registry.add_image(NAME, ["610.57.04-flatcar"])
    versions, feed = _files(tmp_path)
    tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
               releases_url=feed, syft_sha256=_stub_sha256(stubs))  # fmt: skip
    assert [line.split()[:2] for line in _commands(stubs)] == [
        ["cosign", "sign"], ["syft", "scan"], ["cosign", "attest"]]  # fmt: skip


def test_another_syft_than_the_pinned_one_signs_nothing(
    registry: OCIRegistry, stubs: Path, tmp_path: Path
) -> None:
    registry.add_image(NAME, ["610.57.04-flatcar"])
    versions, feed = _files(tmp_path)
    actual = _stub_sha256(stubs)
    with pytest.raises(Exit, match=rf"has SHA-256 {actual}, not the pinned {'c' * 64}: .*"
                                   r"nothing was signed$"):  # fmt: skip
        tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
                   releases_url=feed, syft_sha256="c" * 64)  # fmt: skip
    assert _commands(stubs) == []


def test_a_pinned_syft_that_is_missing_signs_nothing(
    registry: OCIRegistry, stubs: Path, tmp_path: Path
) -> None:
    (stubs.parent / "bin" / "syft").unlink()
    registry.add_image(NAME, ["610.57.04-flatcar"])
    versions, feed = _files(tmp_path)
    with pytest.raises(Exit, match="syft is not on PATH, and --syft-sha256 asks for it"):
        tasks.sign(MockContext(), registry=f"{registry.host}/gdc", versions_file=versions,
                   releases_url=feed, syft_sha256="c" * 64)  # fmt: skip
    assert _commands(stubs) == []


@pytest.mark.parametrize("value", ["abc", "C" * 64, "c" * 63 + "\n"])
def test_a_malformed_syft_sha256_is_refused_before_any_request(value: str) -> None:
    with pytest.raises(Exit, match=r"--syft-sha256 .* is not a SHA-256"):
        tasks.sign(MockContext(), registry="ghcr.io/me", syft_sha256=value)
