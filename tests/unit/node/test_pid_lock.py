"""The pid lock that keeps one driver instance per node, and atomic writes in /run/nvidia."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from nvidia_driver.atomic import write_atomically
from nvidia_driver.errors import DriverError
from nvidia_driver.node import lifecycle
from nvidia_driver.node.lifecycle import PidLock


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "run" / "nvidia" / "nvidia-driver.pid"


def test_the_lock_records_the_pid_and_refuses_a_second_instance(pid_file: Path) -> None:
    first = PidLock(pid_file)
    first.acquire()

    with pytest.raises(DriverError, match=rf"already running.*pid {os.getpid()} holds"):
        PidLock(pid_file).acquire()

    assert pid_file.read_text() == f"{os.getpid()}\n"
    first.release()
    assert not pid_file.exists()


def test_an_instance_that_opened_the_file_before_it_was_released_does_not_share_the_lock(
    pid_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race: the second instance opens the lock file, the first releases it (unlink, close),
    # the second then locks the unlinked file, and a third creates and locks a new one.
    first, second, third = PidLock(pid_file), PidLock(pid_file), PidLock(pid_file)
    first.acquire()
    real_flock = fcntl.flock

    def release_first_then_flock(fd: int, operation: int) -> None:
        first.release()
        real_flock(fd, operation)

    monkeypatch.setattr(lifecycle.fcntl, "flock", release_first_then_flock)
    second.acquire()
    monkeypatch.setattr(lifecycle.fcntl, "flock", real_flock)

    with pytest.raises(DriverError, match="already running"):
        third.acquire()
    assert second.fd is not None
    assert os.fstat(second.fd).st_ino == pid_file.stat().st_ino
    second.release()


def test_the_lock_does_not_follow_a_symbolic_link(pid_file: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid_file.parent.mkdir(parents=True)
    pid_file.symlink_to(victim)

    with pytest.raises(DriverError) as raised:
        PidLock(pid_file).acquire()

    assert str(raised.value) == (
        f"cannot open the lock file {pid_file}: it is a symbolic link; remove it and start again"
    )
    assert victim.read_text() == "precious\n"


def test_an_atomic_write_neither_follows_nor_replaces_a_planted_temporary_name(
    tmp_path: Path,
) -> None:
    # The old helper wrote to ".<name>.tmp" through any symbolic link found there.
    status = tmp_path / "validations" / ".driver-daemons-status"
    status.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = status.with_name(f".{status.name}.tmp")
    planted.symlink_to(victim)

    write_atomically(status, "Ready\n")

    assert status.read_text() == "Ready\n"
    assert not status.is_symlink()
    assert victim.read_text() == "precious\n"
    assert planted.is_symlink()
    assert sorted(path.name for path in status.parent.iterdir()) == sorted(
        [status.name, planted.name]
    )


def test_an_atomic_write_leaves_no_temporary_file_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir()  # a directory where the file should go: the rename fails

    with pytest.raises(OSError, match="Is a directory"):
        write_atomically(target, "digest")

    assert list(tmp_path.iterdir()) == [target]


def test_an_atomic_write_gives_the_file_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "banner"
    write_atomically(target, b"Linux version 6.12.81-flatcar\n")

    assert target.read_bytes() == b"Linux version 6.12.81-flatcar\n"
    assert target.stat().st_mode & 0o777 == 0o644
