"""zstd layers end to end: what dockerd pushes, recompressed in the registry, read by containerd.

The suite's dockerd (Debian 12's 20.10, which pushes gzip layers only) pushes a tiny imported
image to Debian's docker-registry; :func:`gdc.compression.recompress` rewrites it with zstd
layers through the registry API; then containerd, the runtime a Flatcar node runs (here
Debian 12's 1.6, older than Flatcar's 1.7.17+ and so a conservative reader), pulls it over plain
http, unpacks it (checking each layer's uncompressed digest against the config's diff_ids) and
mounts its root filesystem, from which a file is read. containerd is the one dockerd runs
(``--exec-root /run/gdc-docker``, fixtures/docker_env.py), reached with ``ctr --address``.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.docker_env import DOCKER_HOST, DockerDaemon, Registry
from fixtures.shell import run

from gdc.compression import recompress
from gdc.registry import Registry as RegistryClient
from nvidia_driver.formats.oci import ZSTD_LAYER

pytestmark = pytest.mark.integration

CONTAINERD = Path("/run/gdc-docker/containerd/containerd.sock")  # dockerd's own containerd
NAMESPACE = "gdc-test"
NAME = "gdc-test/zstd"
GREETING = b"read by containerd from a zstd layer\n"
TIMEOUT = 120


def _rootfs(path: Path) -> Path:
    """A two-file root filesystem as a tar, what docker import takes."""
    with tarfile.open(path, "w") as tar:
        for name, content in (("hello.txt", GREETING), ("etc/os-release", b"ID=gdc-test\n")):
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(content), 0o644
            tar.addfile(member, io.BytesIO(content))
    return path


def _ctr(*args: str) -> str:
    argv = ["ctr", "--address", str(CONTAINERD), "--namespace", NAMESPACE, *args]
    return run(argv, timeout=TIMEOUT).stdout


def _docker(*args: str) -> str:
    return run(["docker", "--host", DOCKER_HOST, *args], timeout=TIMEOUT).stdout


@pytest.fixture
def pushed(docker_daemon: DockerDaemon, docker_registry: Registry,
           tmp_path: Path) -> Iterator[str]:  # fmt: skip
    """A tiny image pushed by dockerd (gzip layers) under a fresh tag; its reference."""
    assert docker_daemon.host == DOCKER_HOST
    reference = f"{docker_registry.address}/{NAME}:t{os.getpid()}"
    _docker("import", str(_rootfs(tmp_path / "rootfs.tar")), reference)
    try:
        _docker("push", reference)
        yield reference
    finally:
        _docker("image", "rm", reference)


def test_containerd_pulls_and_unpacks_an_image_recompressed_to_zstd(
    pushed: str, docker_registry: Registry, tmp_path: Path
) -> None:
    client = RegistryClient(docker_registry.address)
    tag = pushed.rpartition(":")[2]
    before = client.manifest(NAME, tag)
    assert [layer["mediaType"] for layer in before.json()["layers"]] == [
        "application/vnd.docker.image.rootfs.diff.tar.gzip"]  # fmt: skip
    digest = recompress(client, NAME, tag)
    after = client.manifest(NAME, tag)
    assert after.digest == digest != before.digest
    assert after.media_type == "application/vnd.oci.image.manifest.v1+json"
    assert [layer["mediaType"] for layer in after.json()["layers"]] == [ZSTD_LAYER]
    diff_ids = client.config(NAME, after)["rootfs"]["diff_ids"]

    assert CONTAINERD.is_socket(), f"no containerd at {CONTAINERD}: is dockerd's exec root moved?"
    mountpoint = tmp_path / "rootfs"
    mountpoint.mkdir()
    try:
        pulled = _ctr("images", "pull", "--plain-http", "--print-chainid", pushed)
        # One layer: its chain ID is its diff_id, which containerd checked as it unpacked.
        assert f"image chain ID: {diff_ids[0]}" in pulled, pulled
        assert digest in _ctr("images", "list", f"name=={pushed}")
        _ctr("images", "mount", pushed, str(mountpoint))
        try:
            assert (mountpoint / "hello.txt").read_bytes() == GREETING
        finally:
            _ctr("images", "unmount", "--rm", str(mountpoint))
    finally:
        run(["ctr", "--address", str(CONTAINERD), "--namespace", NAMESPACE, "images", "rm",
             "--sync", pushed], check=False, timeout=TIMEOUT)  # fmt: skip
    # Recompressing again changes nothing.
    assert recompress(client, NAME, tag) == digest
    assert json.loads(client.manifest(NAME, tag).body) == after.json()
