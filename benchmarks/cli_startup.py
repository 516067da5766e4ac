"""How fast ``nvidia-driver --help`` starts, side by side with a bare Python start.

Usage: python benchmarks/cli_startup.py [RUNS] [--record]
Prints the median wall time of each and their ratio; the goal for --help is under 150 ms. Both
run with the same PYTHONPATH, which puts this checkout's entrypoint/src first: nothing needs to
be installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from record import Report, add_record_option

GOAL_SECONDS = 0.150
ENTRYPOINT = Path(__file__).resolve().parent.parent / "entrypoint" / "src"


def checkout_env() -> dict[str, str]:
    """The environment, with this checkout's entrypoint first on the module search path."""
    paths = [str(ENTRYPOINT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def median_seconds(argv: list[str], runs: int) -> float:
    env = checkout_env()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=20, help="starts of each (default 20)")
    add_record_option(parser)
    args = parser.parse_args()
    runs = args.runs
    with Report("cli_startup", record=args.record):
        bare = median_seconds([sys.executable, "-c", "pass"], runs)
        helps = median_seconds([sys.executable, "-m", "nvidia_driver", "--help"], runs)
        print(f"python -c pass:            {bare * 1000:6.1f} ms (median of {runs})")
        print(f"nvidia-driver --help:      {helps * 1000:6.1f} ms (median of {runs})")
        print(f"ratio --help / bare start: {helps / bare:6.2f}")
        verdict = "meets" if helps < GOAL_SECONDS else "misses"
        print(f"goal < {GOAL_SECONDS * 1000:.0f} ms: {verdict}")
    return 0 if helps < GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
