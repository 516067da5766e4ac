"""The build image's driver root, against what NVIDIA's container toolkit injects.

The session's build image (conftest.py) installed the fixture .run and the redist archives
(fixtures/driver_server.py). Every name recorded in driver-root.toml is checked in the image:
required names present, optional ones present exactly when the fixture .run ships them,
excluded ones absent (files of Debian's own packages, such as libglvnd's loaders, aside);
and ``ldd`` resolves every NVIDIA program and library there.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from fixtures.docker_env import docker_env
from fixtures.images import DRIVER, Invoke
from fixtures.runfile import build_run_fixture, header_keys, payload_offset

from nvidia_driver.image.driverroot import EXCLUDED, OPTIONAL, REQUIRED, library_name, rules

pytestmark = pytest.mark.integration

LIBDIR = "/usr/lib/x86_64-linux-gnu"
BRANCH = int(DRIVER.split(".", 1)[0])
# What the image is asked about, in one container: files, the linker cache, ldd of each ELF.
PROBE = r"""
import json, os, subprocess
libdir = "/usr/lib/x86_64-linux-gnu"
nvidia = ("libnvidia", "libcuda", "libnvcuvid", "libnvoptix", "libEGL_nvidia", "libGLX_nvidia",
          "libGLESv1_CM_nvidia", "libGLESv2_nvidia", "libvdpau_nvidia", "libnvfm", "libnvsdm")
libraries = []
for directory in (libdir, libdir + "/vdpau", "/opt/nvidia/nvlsm/lib"):
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if (name.startswith(nvidia) or directory.startswith("/opt")) and not os.path.islink(path):
            libraries.append(path)
programs = ["/usr/bin/nvidia-smi", "/usr/bin/nv-fabricmanager", "/opt/nvidia/nvlsm/sbin/nvlsm",
            "/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl", "/usr/bin/nvidia-persistenced"]
ldd = {path: subprocess.run(["ldd", path], capture_output=True, text=True).stdout
       for path in programs + libraries}
cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
# What Debian's packages installed (libglvnd's libGL, ...) is not the driver's.
debian = set()
for listing in os.listdir("/var/lib/dpkg/info"):
    if listing.endswith(".list"):
        with open(os.path.join("/var/lib/dpkg/info", listing)) as names:
            debian.update(os.path.realpath(line.strip()) for line in names if line.strip())
files = [path for d in (libdir, libdir + "/vdpau", "/usr/bin") if os.path.isdir(d)
         for path in (os.path.join(d, n) for n in os.listdir(d))
         if os.path.realpath(path) not in debian]
verify = subprocess.run(["python3", "-m", "nvidia_driver.image.provision", "verify", "--arch",
                         "amd64", "--version", os.environ["DRIVER_VERSION"]],
                        capture_output=True, text=True)
print(json.dumps({"ldd": ldd, "cache": cache, "files": sorted(files), "verify":
                  [verify.returncode, verify.stdout + verify.stderr]}))
"""


def _manifest_names(runfile: Path) -> set[str]:
    """The base names the fixture .run's .manifest lists (streamed: it is the first member)."""
    offset = payload_offset(runfile, int(header_keys(runfile)["skip"]))
    with runfile.open("rb") as stream:
        stream.seek(offset)
        zstd = subprocess.Popen(["zstd", "-dc"], stdin=stream, stdout=subprocess.PIPE)
        assert zstd.stdout is not None
        try:
            with tarfile.open(fileobj=zstd.stdout, mode="r|") as tar:
                for member in tar:
                    if member.name == "./.manifest":
                        data = tar.extractfile(member)
                        assert data is not None
                        text = data.read().decode()
                        break
                else:
                    raise AssertionError("no .manifest in the fixture .run")
        finally:
            zstd.kill()
            zstd.wait()
            zstd.stdout.close()
    entries = text.split("\n")[8:]
    return {Path(line.split()[0]).name for line in entries if line.strip()}


@pytest.fixture(scope="module")
def image(invoke: Invoke, build_image: subprocess.CompletedProcess[str]) -> dict[str, object]:
    result = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
         invoke.build_reference, "-c", PROBE],
        env=docker_env(), capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    probed: dict[str, object] = json.loads(result.stdout)
    return probed


def _present(name: str, files: list[str]) -> bool:
    if name.startswith("lib"):
        return any(library_name(Path(path).name) == name for path in files)
    return f"/usr/bin/{name}" in files


def test_the_image_build_verified_its_driver_root(image: dict[str, object]) -> None:
    code, output = image["verify"]  # type: ignore[misc]
    assert code == 0, output
    assert "names the container toolkit injects are installed" in output


def test_every_recorded_name_is_present_or_excluded_with_its_reason(
    image: dict[str, object],
) -> None:
    files = image["files"]
    assert isinstance(files, list)
    shipped = _manifest_names(build_run_fixture(DRIVER))
    shipped_names = {library_name(name) or name for name in shipped}
    checked = 0
    for entry in rules().names:
        present = _present(entry.name, files)
        if entry.status == REQUIRED and entry.shipped_by(BRANCH):
            assert present, f"{entry.name} ({entry.toolkit_list}) is required for {DRIVER}"
        elif entry.status == OPTIONAL:
            assert present == (entry.name in shipped_names), (entry.name, entry.reason)
        elif entry.status == EXCLUDED:
            assert not present, f"{entry.name} is excluded: {entry.reason}"
        else:  # required from a later branch: the 535 .run does not ship it
            assert entry.name not in shipped_names, entry.name
        checked += 1
    assert checked == len(rules().names)


def test_the_libraries_are_in_the_linker_cache_under_their_soname(
    image: dict[str, object],
) -> None:
    cache = image["cache"]
    assert isinstance(cache, str)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-nscq.so.2", "libnvcuvid.so.1",
                   "libnvidia-encode.so.1", "libnvidia-fbc.so.1", "libGLX_nvidia.so.0",
                   "libEGL_nvidia.so.0", "libGLESv2_nvidia.so.2", "libnvoptix.so.1",
                   "libnvidia-ngx.so.1", "libgrpc_mgr.so"):  # fmt: skip
        assert f"\t{soname} (libc6,x86-64) =>" in cache, soname


def test_ldd_finds_every_library_of_the_programs_and_libraries(image: dict[str, object]) -> None:
    ldd = image["ldd"]
    assert isinstance(ldd, dict)
    assert len(ldd) > 30
    for path in ("/usr/bin/nvidia-smi", "/usr/bin/nv-fabricmanager",
                 "/opt/nvidia/nvlsm/sbin/nvlsm", "/usr/bin/nvidia-imex"):  # fmt: skip
        assert "libc.so.6" in ldd[path], f"{path} is not a dynamic executable:\n{ldd[path]}"
    assert "libibumad.so.3 => /" in ldd["/usr/bin/nv-fabricmanager"]
    missing = {path: out for path, out in ldd.items() if "not found" in out}
    assert not missing, json.dumps(missing, indent=1)
