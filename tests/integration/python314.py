"""The unit tests on the images' Python: Debian forky's 3.14, in a forky root (root, dockerd).

The images run Debian forky's python3 (3.14) and its commands (lz4 1.10, gpg, ...); CI's own
machine is Debian 12 (3.11). Run on 3.11 alone, the unit tests passed while, on the images'
Python, a JSON answer 1,000 deep was read instead of refused and forky's lz4 read no kernel
banner. Here the same tests run on a debootstrapped forky root holding the unit tests' commands
(tests/unit/tools.py, as .ci/run installs them on the host, and git), with the test
dependencies of requirements/tests.txt, by hash, installed for CPython 3.14 into a cached
directory (uv, which .ci/run's venv carries). The checkout is mounted read only; nothing is
reached over the network once the root and the wheels are cached.

Usage (root; nox -s tests_python314 -- [pytest arguments]):
  python tests/integration/python314.py [pytest arguments]
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from fixtures.cache import cache_dir, cached_dir, file_lock
from fixtures.debian import debootstrap_tarball
from fixtures.docker_env import DOCKER_HOST, start_dockerd, stop_dockerd
from tools import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
SUITE = "forky"  # the images' base (images/build/Dockerfile)
PYTHON = "3.14"  # forky's python3
# The unit tests' commands, Python, and git (the benchmarks' records and the proposing tasks).
INCLUDE = tuple(sorted({*PACKAGES.values(), "python3", "git"}))
REQUIREMENTS = ROOT / "requirements" / "tests.txt"
REPOSITORY = "gdc-test/python314"
SRC = "/src"
SITE = f"/usr/local/lib/python{PYTHON}/dist-packages"  # Debian's, for what pip installs
PACKAGE = "/usr/lib/python3/dist-packages/nvidia_driver"


def docker(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", "--host", DOCKER_HOST, *args], check=False)


def root_image() -> str:
    """The forky root as a local image, imported once per root."""
    tarball = debootstrap_tarball(SUITE, INCLUDE)
    reference = f"{REPOSITORY}:{tarball.stem.removeprefix('debootstrap-')}"
    with file_lock(cache_dir() / ".python314-image.lock"):
        if docker("image", "inspect", reference).returncode != 0:
            imported = docker("import", str(tarball), reference)
            if imported.returncode != 0:
                raise RuntimeError(f"docker import {tarball} failed")
    return reference


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


def main(pytest_args: list[str]) -> int:
    deps = dependencies()
    daemon = start_dockerd()
    try:
        image = root_image()
        # On Debian's own sys.path, where the images copy the package (images/build/Dockerfile),
        # so that the tests' `python3 -m nvidia_driver` finds it in any environment.
        argv = ["run", "--rm", "--network", "none", "--workdir", SRC,
                "--volume", f"{ROOT}:{SRC}:ro", "--volume", f"{deps}:{SITE}:ro",
                "--volume", f"{ROOT}/entrypoint/src/nvidia_driver:{PACKAGE}:ro",
                "--env", "PYTHONDONTWRITEBYTECODE=1", "--env", "HOME=/tmp",
                image, "python3", "-m", "pytest", "-p", "no:cacheprovider",
                *(pytest_args or ["-n", "2", "tests/unit"])]  # fmt: skip
        return docker(*argv).returncode
    finally:
        stop_dockerd(daemon)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
