"""The subprocess seam: what a long command leaves behind when its caller stops early."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from simhost import process_alive

from nvidia_driver.commands import Commands, lines


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
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child)


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
