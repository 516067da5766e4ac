"""The unit tests on the images' Python: Debian forky's 3.14, in a forky root (root).

The images run Debian forky's python3 (3.14) and its commands (lz4 1.10, gpg, ...); CI's own
machine is Debian 12 (3.11). Run on 3.11 alone, the unit tests passed while, on the images'
Python, a JSON answer 1,000 deep was read instead of refused and forky's lz4 read no kernel
banner. Here the same tests run on a debootstrapped forky root holding the unit tests' commands
(tests/unit/tools.py, as .ci/run installs them on the host, and git), with the test
dependencies of requirements/tests.txt, by hash, installed for CPython 3.14 into a cached
directory (uv, which .ci/run's venv carries). The root is a chroot in a mount namespace of its
own, with the checkout mounted read only; nothing is reached over the network once the root and
the wheels are cached.

Usage (root; nox -s tests_python314 -- [pytest arguments]):
  python tests/integration/python314.py [pytest arguments]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from fixtures.cache import cache_dir, cached_dir
from fixtures.debian import debootstrap_tarball
from tools import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
SUITE = "forky"  # the images' base (images/build/Dockerfile)
PYTHON = "3.14"  # forky's python3
# The unit tests' commands, Python, and git (the benchmarks' records and the proposing tasks).
INCLUDE = tuple(sorted({*PACKAGES.values(), "python3", "git"}))
REQUIREMENTS = ROOT / "requirements" / "tests.txt"
SITE = f"/usr/local/lib/python{PYTHON}/dist-packages"  # Debian's, for what pip installs
PACKAGE = "/usr/lib/python3/dist-packages/nvidia_driver"


def dependencies() -> Path:
    """requirements/tests.txt installed for CPython 3.14 on x86_64, cached by its hash."""
    uv = shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv is not on PATH: install requirements/nox.txt (.ci/run does)")
    key = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]

    def install(tmp: Path) -> None:
        subprocess.run([uv, "pip", "install", "--quiet", "--target", str(tmp),
                        "--python-version", PYTHON, "--python-platform",
                        "x86_64-manylinux_2_28", "--require-hashes", "--no-deps",
                        "-r", str(REQUIREMENTS)], check=True)  # fmt: skip

    return cached_dir(cache_dir() / "python314" / f"requirements-{key}", install)


# In a private mount namespace (nothing shows on the host, all of it goes with the process):
# the checkout read only, the wheels and the package where Debian's python3 finds them (the
# images copy the package there, images/build/Dockerfile), /proc, /dev and a /tmp of its own.
_ENTER = """set -e
root=$1; shift
mkdir -p "$root/src" "$root$SITE" "$root$PACKAGE"
mount --bind "$CHECKOUT" "$root/src"; mount -o remount,bind,ro "$root/src"
mount --bind "$DEPS" "$root$SITE"; mount -o remount,bind,ro "$root$SITE"
mount --bind "$CHECKOUT/entrypoint/src/nvidia_driver" "$root$PACKAGE"
mount -t proc proc "$root/proc"; mount --rbind /dev "$root/dev"; mount -t tmpfs tmp "$root/tmp"
cd "$root/src"
exec chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/tmp PYTHONDONTWRITEBYTECODE=1 sh -c 'cd /src && exec "$@"' sh "$@"
"""


def main(pytest_args: list[str]) -> int:
    """No dockerd: the session runs beside others that start and stop theirs."""
    deps = dependencies()
    tarball = debootstrap_tarball(SUITE, INCLUDE)
    with tempfile.TemporaryDirectory(prefix="gdc-python314-") as scratch:
        root = Path(scratch) / "root"
        root.mkdir()
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xf", str(tarball)],
                       check=True)  # fmt: skip
        env = {**os.environ, "CHECKOUT": str(ROOT), "DEPS": str(deps), "SITE": SITE,
               "PACKAGE": PACKAGE}  # fmt: skip
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh",
                str(root), "python3", "-m", "pytest", "-p", "no:cacheprovider",
                *(pytest_args or ["-n", "2", "tests/unit"])]  # fmt: skip
        return subprocess.run(argv, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
