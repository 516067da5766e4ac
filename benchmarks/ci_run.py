"""How long CI takes: ``.ci/run`` on a fresh clone of this checkout's HEAD, as CI runs it.

Usage: python benchmarks/ci_run.py [--cold] [--keep] [--record]   (root, Debian 12)

The clone is made in a new directory with nothing beside it (CI's clean clone), and run with
``CI=true``. With ``--cold`` the cache (``GDC_CACHE``, Docker's data root included) starts
empty, as on a fresh machine; without it the run uses the usual cache
(``~/.cache/gpu-driver-container``). The run waits for the machine's integration lock
(``/tmp/gdc-integration.lock``, docs/development.md) first, which is not counted. It prints the
wall clock against CI's 60-minute budget for a cold run, and each session's own figures as nox
and pytest printed them. The whole output goes to a log, whose path is printed.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import REPOSITORY, Report, add_record_option

BUDGET_MINUTES = 60.0
LOCK = Path("/tmp/gdc-integration.lock")  # noqa: S108 - the machine-wide lock every run takes
# What nox and pytest print at a session's end: the figures worth keeping from a run.
_SUMMARY = re.compile(
    r"^(nox > Session \S+ (was successful|failed).*"
    r"|=+ .*\b(passed|failed|error)\b.* in [0-9.]+s.* =+"
    r"|--- nox .*: exit \d+ ---)$"
)


def run_ci(clone: Path, cache: Path, log: Path) -> tuple[int, float, list[str]]:
    """.ci/run in clone: its exit status, its wall clock in seconds, its summary lines."""
    env = {**os.environ, "CI": "true", "GDC_CACHE": str(cache)}
    summary: list[str] = []
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(["bash", ".ci/run"], cwd=clone, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            out.write(line)
            if _SUMMARY.match(line.strip()):
                summary.append(line.strip())
        status = process.wait()
    return status, time.monotonic() - started, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="start from an empty cache")
    parser.add_argument("--keep", action="store_true", help="keep the clone (and cold cache)")
    add_record_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error(".ci/run installs packages and starts dockerd: run as root")
    scratch = Path(tempfile.mkdtemp(prefix="gdc-ci-run-", dir="/var/tmp"))
    clone, log = scratch / "clone", scratch / "ci.log"
    cache = scratch / "cache" if args.cold else Path.home() / ".cache" / "gpu-driver-container"
    subprocess.run(["git", "clone", "--quiet", str(REPOSITORY), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short=12", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    try:
        with LOCK.open("a") as lock:
            print(f"waiting for {LOCK}...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Dated, and the load taken, as the run starts; its commit is the clone's.
            report = Report("ci_run", record=args.record, measured=head)
            status, seconds, summary = run_ci(clone, cache, log)
    finally:
        if not args.keep:
            shutil.rmtree(clone, ignore_errors=True)
            if args.cold:
                shutil.rmtree(cache, ignore_errors=True)
    with report:
        kind = "cold (empty cache, Docker's data root included)" if args.cold else "warm cache"
        print(f"bash .ci/run on a fresh clone of {head}, CI=true, {kind}:")
        print(f"  exit {status}, wall clock {seconds / 60:.1f} min ({seconds:.0f} s)")
        if args.cold:
            print(f"  over CI's cold budget of {BUDGET_MINUTES:.0f} min: "
                  f"{seconds / 60 / BUDGET_MINUTES:.2f}")  # fmt: skip
        for line in summary:
            print(f"  {line}")
    print(f"log: {log}")
    return status


if __name__ == "__main__":
    sys.exit(main())
