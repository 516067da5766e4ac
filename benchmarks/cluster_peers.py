"""What the cluster session's real peers cost: a cold build, a warm one, and the warm session.

Usage: python benchmarks/cluster_peers.py [--record]   (root, Debian 12, Go 1.26; the network
to the Go module proxy)

1. Cold: every peer of tests/integration/cluster/peers.toml built with an empty Go module cache
   and build cache (a fresh ``GDC_CACHE``), as on a fresh CI machine: downloads included.
2. Warm: the same again, on that cache: nothing is built (the binaries are found by their key).
3. The session, warm: ``nox -s cluster`` with the machine's usual cache, as a second CI run
   on the same machine would run it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import REPOSITORY, Report, add_record_option

CLUSTER = REPOSITORY / "tests" / "integration" / "cluster"


def build_all(cache: Path) -> dict[str, float]:
    """Each peer's build time, in peers.toml's order, with GDC_CACHE=cache."""
    env = {**os.environ, "GDC_CACHE": str(cache)}
    listed = subprocess.run([sys.executable, str(CLUSTER / "peers.py"), "list"], check=True,
                            capture_output=True, text=True).stdout.split()  # fmt: skip
    times = {}
    for name in listed:
        started = time.monotonic()
        subprocess.run([sys.executable, str(CLUSTER / "peers.py"), "build", name], env=env,
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        times[name] = time.monotonic() - started
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_option(parser)
    args = parser.parse_args()
    with Report("cluster_peers", record=args.record):
        with tempfile.TemporaryDirectory(prefix="gdc-peers-") as scratch:
            cold = build_all(Path(scratch))
            warm = build_all(Path(scratch))
            subprocess.run(["chmod", "-R", "u+w", scratch], check=False)  # Go's read-only modules
        print("Peers of tests/integration/cluster/peers.toml, one module and build cache:")
        for name in cold:
            print(f"  {name:<15} cold {cold[name]:6.1f} s   warm {warm[name]:5.1f} s")
        total_cold, total_warm = sum(cold.values()), sum(warm.values())
        print(f"  all peers       cold {total_cold:6.1f} s ({total_cold / 60:.1f} min)   "
              f"warm {total_warm:5.1f} s: warm/cold {total_warm / total_cold:.3f}")  # fmt: skip
        nox = [shutil.which("nox") or "nox", "-s", "cluster"]  # the venv of docs/development.md
        started = time.monotonic()
        session = subprocess.run(nox, cwd=REPOSITORY, check=False, capture_output=True, text=True)
        seconds = time.monotonic() - started
        print(f"nox -s cluster, warm: exit {session.returncode}, {seconds:.0f} s")
        for line in [line for line in session.stdout.splitlines() if " passed" in line][-1:]:
            print(f"  {line.strip()}")
    return session.returncode


if __name__ == "__main__":
    sys.exit(main())
