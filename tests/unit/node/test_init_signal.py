"""SIGTERM while init downloads its release's build tree: it stops at once and cleans up."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fetch_gpg import Signer
from fetch_server import ReleaseServer, flatcar_digests
from simhost import SimulatedHost
from tools import require

# The simulated node's release (simhost's os-release), served by a stalling release server.
TARBALL = "stable/amd64-usr/4593.2.0/flatcar-container.tar.gz"


def incompressible_tarball() -> bytes:
    data = b"".join(hashlib.sha512(i.to_bytes(4, "big")).digest() for i in range((4 << 20) // 64))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        member = tarfile.TarInfo("./usr/lib/modules/6.12.81-flatcar/build/vmlinux")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def signer(tmp_path: Path) -> Iterator[Signer]:
    require("gpg", "gpgv")
    made = Signer.create(tmp_path / "gpg", "Buildbot <b@example.invalid>")
    yield made
    made.stop_agent()


def test_sigterm_during_the_tree_download_stops_init_at_once_and_leaves_nothing(
    host: SimulatedHost, signer: Signer, tmp_path: Path
) -> None:
    # No build tree on the node: init streams its release's container tarball, which stalls
    # halfway. Before, the signal became an error of the download: init waited for the read
    # timeout (60 s), then reported a broken download instead of shutting down.
    with ReleaseServer(tmp_path / "release") as server:
        tarball = server.root / TARBALL
        tarball.parent.mkdir(parents=True)
        tarball.write_bytes(incompressible_tarball())
        tarball.with_name(f"{tarball.name}.DIGESTS").write_text(
            flatcar_digests(tarball.name, tarball.read_bytes())
        )
        signer.sign(tarball)
        server.stalled.add(f"/{TARBALL}")
        driver = host.start(
            "init",
            FLATCAR_RELEASE_BASE_URL=server.url("{channel}"),
            FLATCAR_KEYRING=str(signer.export(tmp_path / "keyring.asc", armor=True)),
        )
        driver.wait_for("Extracting the kernel build tree from flatcar-container.tar.gz")
        assert server.stalling.wait(10)
        time.sleep(0.2)  # the inflating thread is blocked on the socket now

        started = time.monotonic()
        code = driver.terminate(timeout=30)

    assert time.monotonic() - started < 5
    assert code == 0
    assert "Caught signal" in driver.output
    assert "broke off" not in driver.output
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()
    cache = host.path("/run/nvidia/cache")
    left = sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file())
    assert left == []
