"""The subprocess seam: what a long command leaves behind when its caller stops early."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from processes import process_gone

from nvidia_driver.commands import DRAIN_LIMIT, Commands, lines
from nvidia_driver.errors import DriverError


def test_leaving_a_stream_early_kills_the_whole_process_group(tmp_path: Path) -> None:
    """As make -j's compilers when a SIGTERM arrives in the middle of a build."""
    script = "sleep 60 & echo $!; echo started; wait"
    children: list[int] = []

    def build() -> None:
        with Commands().stream("sh", ["-c", script], cwd=tmp_path) as process:
            output = lines(process.stdout)
            children.append(int(next(output)))
            assert next(output) == "started"
            raise KeyboardInterrupt  # as the signal handler raises in the middle of make

    with pytest.raises(KeyboardInterrupt):
        build()
    [child] = children
    deadline = time.monotonic() + 5
    while not process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_gone(child)


def test_a_spawned_daemon_runs_detached_with_its_output_in_a_log(tmp_path: Path) -> None:
    log = tmp_path / "log/daemon.log"
    pid = Commands().spawn("sh", "-c", "echo up; exec sleep 60", log=log)
    try:
        deadline = time.monotonic() + 5
        while "up" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text() == "up\n"
        assert os.getsid(pid) == pid  # its own session: no signal meant for init reaches it
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _zstd_of_zeros(tmp_path: Path, size: int) -> Path:
    """A zstd stream of ``size`` zero bytes: a few kilobytes that decompress to ``size``."""
    path = tmp_path / f"zeros-{size}.zst"
    path.write_bytes(
        subprocess.run(
            ["zstd", "-q", "-c"], input=bytes(size), capture_output=True, check=True
        ).stdout
    )
    return path


def test_a_filters_unread_tail_is_drained_to_its_exit_status(tmp_path: Path) -> None:
    """A tar archive's padding after its end: drained, so that zstd ends of itself (exit 0)."""
    with (
        _zstd_of_zeros(tmp_path, 1024 * 1024).open("rb") as source,
        Commands().pipe_bytes("zstd", ["-d", "-c"], source) as output,
    ):
        assert output.read(512) == bytes(512)


def test_a_filter_writing_far_past_what_its_reader_wanted_is_stopped(tmp_path: Path) -> None:
    """A bomb's tail after the archive the reader wanted: not decompressed to its end."""
    bomb = _zstd_of_zeros(tmp_path, DRAIN_LIMIT * 2)
    assert bomb.stat().st_size < 64 * 1024
    with (
        pytest.raises(DriverError) as raised,
        bomb.open("rb") as source,
        Commands().pipe_bytes("zstd", ["-d", "-c"], source) as output,
    ):
        assert output.read(512) == bytes(512)
    assert str(raised.value) == (
        "zstd wrote over 16 MiB past the end of what was read from it: the input holds more "
        "than it should; delete it and fetch it again"
    )
