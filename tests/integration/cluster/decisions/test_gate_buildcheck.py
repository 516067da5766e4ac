"""The build image's check: the staged kernel's gcc, from its verified vmlinuz banner."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fetch_gpg import Signer
from fetch_server import ReleaseServer, flatcar_digests
from gate_cluster import STAGED, GateCluster
from vmlinuz_images import bzimage, bzimage_payload, vmlinux

from nvidia_driver.commands import Commands
from nvidia_driver.gate.buildcheck import BuildImage
from nvidia_driver.gate.verdict import Verdict, allowed, held
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.sources.flatcar import ReleaseServer as Servers
from nvidia_driver.sources.verify import Trust

# Flatcar 4593's kernels were built by gcc 14.3.1 (field notes; flatcar/scripts SDK).
BANNER = (
    "Linux version 6.12.102-flatcar (build@pony-truck.infra.kinvolk.io) "
    "(x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1 20250801, "
    "GNU ld (Gentoo 2.45 p3) 2.45.0) #1 SMP PREEMPT_DYNAMIC Wed Aug 12 18:02:03 -00 2026"
)
ALIAS = f"610.57.04-flatcar-flatcar{STAGED}"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signer]:
    if not all(shutil.which(tool) for tool in ("gpg", "gpgv", "gpgconf")):
        pytest.skip("gpg, gpgv or gpgconf not installed (CI installs gnupg)")
    made = Signer.create(tmp_path_factory.mktemp("gpg") / "home", "Test <t@example.invalid>")
    yield made
    made.stop_agent()


@pytest.fixture
def release_server(tmp_path: Path, signer: Signer) -> Iterator[ReleaseServer]:
    kernel = tmp_path / "release/stable/amd64-usr" / STAGED / "flatcar_production_image.vmlinuz"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(bzimage(bzimage_payload("gzip", vmlinux(BANNER))))
    kernel.with_name(f"{kernel.name}.DIGESTS").write_text(
        flatcar_digests(kernel.name, kernel.read_bytes())
    )
    signer.sign(kernel)
    with ReleaseServer(tmp_path / "release") as server:
        yield server


def _image(
    tmp_path: Path,
    signer: Signer,
    server: ReleaseServer,
    *,
    gcc: tuple[str, ...],
    driver: str = "610.57.04",
) -> BuildImage:
    tools = tmp_path / "image-bin"
    tools.mkdir(exist_ok=True)
    # The build image carries both (images/build/Dockerfile): gpgv checks a signature, gpg lists
    # the signing key's expiry, which every check reads since 2c177ee.
    for tool in ("gpgv", "gpg"):
        (tools / tool).symlink_to(shutil.which(tool) or tool)
    for name in gcc:
        (tools / name).write_text("#!/bin/sh\necho 14.4.0\n")
        (tools / name).chmod(0o755)
    commands = Commands({"PATH": str(tools)})
    keyring = signer.export(tmp_path / "keyring.gpg", armor=False)
    releases = FlatcarReleases(
        commands,
        tmp_path / "cache",
        tmp_path / "work",
        server=Servers(server.url("{channel}")),
        trust=Trust.of_keyring(keyring),
    )
    return BuildImage(driver, commands, releases)


def _verdict(gpu_cluster: GateCluster, image: BuildImage) -> Verdict:
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04-flatcar")
    gpu_cluster.publish(ALIAS)
    return gpu_cluster.checker(gpu_cluster.api_client(), image).verdict(
        gpu_cluster.node("gpu-1"), STAGED
    )


def test_the_build_image_serves_a_kernel_built_by_a_gcc_it_has(
    gpu_cluster: GateCluster, tmp_path: Path, signer: Signer, release_server: ReleaseServer
) -> None:
    image = _image(tmp_path, signer, release_server, gcc=("gcc-13", "gcc-14", "gcc-15"))
    assert _verdict(gpu_cluster, image) == allowed(
        f"flatcar {STAGED}: {gpu_cluster.repository}/driver:{ALIAS} published; builds with "
        "this image's gcc-14"
    )
    assert not any((tmp_path / "work").iterdir())  # the 32 MB kernel image is not kept
    assert (tmp_path / "cache/banners").is_dir()


def test_a_kernel_gcc_the_image_lacks_is_said_and_lets_the_reboot_go(
    gpu_cluster: GateCluster, tmp_path: Path, signer: Signer, release_server: ReleaseServer
) -> None:
    """The runtime build then takes the release's developer container: slower, not broken."""
    image = _image(tmp_path, signer, release_server, gcc=("gcc-13", "gcc-15"))
    verdict = _verdict(gpu_cluster, image)
    assert verdict.allowed
    assert verdict.line.endswith(
        "; no gcc-14 in this image: the build uses the release's developer "
        "container (a download of about 480 MB at the first start)"
    )


def test_a_kernel_image_that_fails_verification_holds(
    gpu_cluster: GateCluster, tmp_path: Path, signer: Signer, release_server: ReleaseServer
) -> None:
    kernel = release_server.root / "stable/amd64-usr" / STAGED / "flatcar_production_image.vmlinuz"
    genuine = kernel.read_bytes()
    kernel.write_bytes(genuine[:-1] + b"\0")
    # The fixture's kernel is compressed here, so its digest depends on this Python's zlib.
    recorded = hashlib.sha512(genuine).hexdigest()[:16]
    verdict = _verdict(gpu_cluster, _image(tmp_path, signer, release_server, gcc=("gcc-14",)))
    assert not verdict.allowed
    assert verdict.line.startswith(
        f"flatcar {STAGED}: cannot check its driver image: the SHA512 of "
    )
    assert verdict.line.endswith(
        f"does not match its DIGESTS file ({recorded}...): the download is "
        "corrupted or truncated; try again"
    )


def test_a_gate_running_another_build_image_cannot_speak_for_the_clusters(
    gpu_cluster: GateCluster, tmp_path: Path, signer: Signer, release_server: ReleaseServer
) -> None:
    image = _image(tmp_path, signer, release_server, gcc=("gcc-14",), driver="595.91.07")
    assert _verdict(gpu_cluster, image) == held(
        f"flatcar {STAGED}: the gate runs the build image of driver 595.91.07, the "
        "ClusterPolicy cluster-policy names 610.57.04: run the gate from the cluster's "
        "build image so it can check that image's compilers"
    )
