"""The one seam through which the entrypoint runs other programs.

Commands are looked up on ``PATH`` (never by absolute path), so tests put recording stubs there
and a production image finds the real tools.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nvidia_driver.errors import DriverError
from nvidia_driver.settings import PATH

FILTER_EXIT_GRACE_SECONDS = 1.0
# What a filter may still write once its reader has what it wanted, drained so that the filter
# ends of itself and reports a broken stream: a tar archive's padding to its record size, a
# kernel image's trailing bytes. Past it the input is not what the reader expects (a bomb's
# tail), and the filter is stopped.
DRAIN_LIMIT = 16 * 1024 * 1024


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


@dataclass
class Commands:
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get(PATH, os.defpath))

    def require(self, name: str) -> str:
        found = self.which(name)
        if found is None:
            raise DriverError(
                f"{name} not found on PATH ({self.env.get(PATH, '')}): "
                "the image is incomplete; rebuild it or report a bug"
            )
        return found

    def argv(self, name: str, args: Sequence[str | os.PathLike[str]]) -> list[str]:
        return [self.require(name), *(os.fspath(arg) for arg in args)]

    def run(
        self,
        name: str,
        *args: str | os.PathLike[str],
        check: bool = True,
        timeout: float | None = None,
        cwd: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion, capturing output; on failure raise with the command's own reason."""
        try:
            result = subprocess.run(
                self.argv(name, args),
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout,
                cwd=cwd,
                env={**self.env, **(extra_env or {})},
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverError(f"{name} did not finish within {timeout:g} s") from exc
        if check and result.returncode != 0:
            reason = _first_line(result.stderr) or _first_line(result.stdout) or "no output"
            raise DriverError(f"{name} failed (exit {result.returncode}): {reason}")
        return result

    def spawn(self, name: str, *args: str | os.PathLike[str], log: Path) -> int:
        """Start a daemon that stays in the foreground, detached, its output in log; its pid."""
        argv = self.argv(name, args)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, out.fileno(), 2),
            ]
            # Not a Popen: nothing waits for a daemon, which init stops by its pid file.
            return os.posix_spawn(argv[0], argv, self.env, file_actions=actions, setsid=True)

    @contextmanager
    def stream(
        self,
        name: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        cwd: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> Iterator[subprocess.Popen[str]]:
        """Start a long command whose merged output the caller reads line by line.

        It runs in its own process group: leaving the block early (an error, a signal) kills
        the whole group, so no compiler a ``make -j`` started keeps writing after it.
        """
        process = subprocess.Popen(
            self.argv(name, args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            cwd=cwd,
            env={**self.env, **(extra_env or {})},
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if process.stdout is not None:
                process.stdout.close()

    @contextmanager
    def pipe_bytes(
        self, name: str, args: Sequence[str | os.PathLike[str]], source: IO[bytes]
    ) -> Iterator[IO[bytes]]:
        """Run a byte filter (a decompressor) reading ``source`` from its current offset.

        The caller reads the binary output. Whatever it leaves unread is drained afterwards, up
        to :data:`DRAIN_LIMIT` bytes, so that a filter is never killed by a closed pipe; a failed
        exit raises with its own reason, and more output than the limit with that.
        """
        argv = self.argv(name, args)
        # stderr goes to a file: a pipe nobody reads while stdout is read could fill and block.
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(
                argv, stdin=source, stdout=subprocess.PIPE, stderr=errors, env=self.env
            )
            output = process.stdout
            assert output is not None  # stdout=PIPE
            try:
                yield output
                _drain(output, name)
            except Exception as exc:
                # Output cut short by the filter's own failure: its reason says more. A filter
                # that failed is exiting; one still writing is given up on after a moment.
                with suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=FILTER_EXIT_GRACE_SECONDS)
                if process.returncode:
                    raise _filter_failure(name, process.returncode, errors) from exc
                raise
            except BaseException:
                process.kill()
                raise
            finally:
                output.close()  # a filter still writing ends on the broken pipe
                returncode = process.wait()
            if returncode != 0:
                raise _filter_failure(name, returncode, errors)


def _drain(output: IO[bytes], name: str) -> None:
    drained = 0
    while chunk := output.read(1 << 16):
        drained += len(chunk)
        if drained > DRAIN_LIMIT:
            raise DriverError(
                f"{name} wrote over {DRAIN_LIMIT // (1024 * 1024)} MiB past the end of what was "
                "read from it: the input holds more than it should; delete it and fetch it again"
            )


def _filter_failure(name: str, returncode: int, errors: IO[bytes]) -> DriverError:
    errors.seek(0)
    reason = _first_line(errors.read().decode(errors="replace")) or "no output"
    return DriverError(f"{name} failed (exit {returncode}): {reason}")


def lines(stream: IO[str] | None) -> Iterator[str]:
    if stream is None:
        return
    for line in stream:
        yield line.rstrip("\n")
