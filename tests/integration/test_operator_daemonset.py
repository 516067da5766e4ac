"""The precompiled image, run as the GPU Operator's driver DaemonSet runs it.

``docker run`` with the DaemonSet's privileges, environment, command and host mounts, on a
simulated node (fixtures/daemonset.py): only the GPU and module loading are stood in for. The
image is the session's precompiled image (conftest.py), shared with test_images.py. Each test
checks what the Operator and its validator see: the log lines, the driver root bind-mounted on
the host's /run/nvidia/driver, the pid and status files, the startup probe, and a clean stop.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from fixtures.daemonset import (
    HGX_H100,
    KEYRING,
    L40S_SERVER,
    READY_LINE,
    DriverPod,
    Hardware,
    Node,
    driver_pod,
    image_packages,
    mismatched,
    process_gone,
)
from fixtures.gpg import SigningKey
from fixtures.images import DRIVER, Invoke
from fixtures.release_server import TEST_RELEASE, FlatcarReleaseServer

pytestmark = pytest.mark.integration

DIGEST = "gdc-test-digest-0001"  # what driver_pod sets as DRIVER_CONFIG_DIGEST
MODULE_PARAMS = {"nvidia": "NVreg_EnableStreamMemOPs=1\n"}
# Where the Operator's validator looks for the driver root's libnvidia-ml.so.1 (x86_64).
VALIDATOR_LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu")
CTR_READY = "GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: false\n"
# The DaemonSet's preStop hook on nvidia-driver-ctr.
PRE_STOP = (
    "rm -f /run/nvidia/validations/.driver-ctr-ready /run/nvidia/validations/.driver-daemons-status"
)
RUNTIME_BUILD_SECONDS = 1800


@pytest.fixture(scope="module")
def precompiled(invoke: Invoke, precompiled_image: subprocess.CompletedProcess[str]) -> str:
    return invoke.precompiled_reference


@pytest.fixture(scope="module")
def banner(precompiled: str) -> str:
    """The kernel the image's packages were built for: the test release's /proc/version."""
    banners = {str(package["banner"]) for package in image_packages(precompiled)}
    assert len(banners) == 1, banners
    return banners.pop()


def flatcar_node(banner: str, hardware: Hardware) -> Node:
    return Node(banner, TEST_RELEASE.kernel.release, TEST_RELEASE.os_release(), hardware,
                MODULE_PARAMS)  # fmt: skip


@pytest.fixture
def nvswitch_pod(precompiled: str, banner: str) -> Iterator[DriverPod]:
    """An HGX H100 node with NVSwitches; KERNEL_MODULE_TYPE unset (auto)."""
    with driver_pod(precompiled, flatcar_node(banner, HGX_H100)) as pod:
        pod.wait_for(READY_LINE)
        yield pod


@pytest.fixture
def l40s_pod(precompiled: str, banner: str) -> Iterator[DriverPod]:
    """An L40S node (no NVSwitch) asking for the open modules."""
    node = flatcar_node(banner, L40S_SERVER)
    with driver_pod(precompiled, node, {"KERNEL_MODULE_TYPE": "open"}) as pod:
        pod.wait_for(READY_LINE)
        yield pod


def _daemon_pids(pod: DriverPod) -> dict[str, int]:
    pids = {}
    for name, pid_file in (
        ("persistenced", "/run/nvidia-persistenced/nvidia-persistenced.pid"),
        ("fabricmanager", "/run/nvidia-fabricmanager/nv-fabricmanager.pid"),
    ):
        result = pod.exec("cat", pid_file)
        if result.returncode == 0:
            pids[name] = int(result.stdout)
    return pids


def _assert_stops_cleanly(pod: DriverPod, daemons: Mapping[str, int]) -> None:
    """The kubelet's stop: preStop hook, then SIGTERM; the node is left as it was."""
    assert pod.exec("/bin/sh", "-c", PRE_STOP).returncode == 0
    assert pod.stop() == 0, pod.output
    after = pod.output.split(READY_LINE, 1)[1]
    assert "Caught signal" in after
    assert "Unloading NVIDIA driver kernel modules..." in after
    assert "Unmounting NVIDIA driver rootfs..." in after
    assert "Could not" not in after
    assert pod.calls("rmmod") == ["rmmod nvidia_modeset nvidia_uvm nvidia"]
    assert not pod.driver_root_mounted()
    assert not (pod.driver_root / "usr").exists()
    assert not (pod.run_nvidia / "nvidia-driver.pid").exists()
    assert not (pod.run_nvidia / "validations/.driver-ctr-ready").exists()
    for name, pid in daemons.items():
        assert process_gone(pid), f"{name} (pid {pid}) still running"


def test_an_nvswitch_node_gets_the_package_the_daemons_and_the_driver_root(
    nvswitch_pod: DriverPod,
) -> None:
    pod = nvswitch_pod
    log = pod.output
    assert "Using the proprietary kernel modules (auto: branch 535" in log
    assert "kernel interface matches." in log
    assert f"Found NVIDIA driver package nvidia-modules-{TEST_RELEASE.kernel.upstream_version}" in (
        log
    )
    assert "Building kernel modules" not in log
    assert "Linking nvidia.ko from its kernel interface..." in log
    assert "Starting NVIDIA persistence daemon..." in log
    assert "Detected 4 NVSwitch device(s)" in log
    assert "Starting NVIDIA fabric manager daemon..." in log
    # The real modprobe, dry run: installed, indexed by depmod, with /drivers/nvidia.conf.
    video = f"/sim/lib/modules/{TEST_RELEASE.kernel.release}/kernel/drivers/video"
    assert f"insmod {video}/nvidia.ko NVreg_EnableStreamMemOPs=1 " in pod.calls("insmod")
    assert f"insmod {video}/nvidia-uvm.ko " in pod.calls("insmod")
    assert f"insmod {video}/nvidia-modeset.ko " in pod.calls("insmod")

    # What the Operator's validator and the other pods find on the host.
    assert pod.driver_root_mounted()
    assert (pod.driver_root / "usr/bin/nvidia-smi").is_file()
    libraries = [pod.driver_root / d / "libnvidia-ml.so.1" for d in VALIDATOR_LIBRARY_DIRS]
    assert any(library.exists() for library in libraries)
    assert (pod.driver_root / f"usr/src/nvidia-{DRIVER}/kernel-open").is_dir()
    pid = int((pod.run_nvidia / "nvidia-driver.pid").read_text())
    # The host PID namespace: the pid file names init's process as the host sees it.
    assert Path(f"/proc/{pid}/cmdline").read_bytes().endswith(b"nvidia-driver\0init\0")
    assert (pod.run_nvidia / "nvidia-driver.state").read_text() == DIGEST
    assert (pod.run_nvidia / "validations/.driver-daemons-status").read_text() == "Ready\n"
    assert pod.firmware_search_path.read_text() == "/run/nvidia/driver/lib/firmware"
    assert (pod.run_fabricmanager / "nv-fabricmanager.pid").is_file()
    daemons = _daemon_pids(pod)
    assert set(daemons) == {"persistenced", "fabricmanager"}
    assert not any(process_gone(pid) for pid in daemons.values())

    probe = pod.probe()
    assert probe.returncode == 0, probe.stdout
    assert (pod.run_nvidia / "validations/.driver-ctr-ready").read_text() == CTR_READY

    _assert_stops_cleanly(pod, daemons)


def test_a_node_without_nvswitch_skips_the_fabric_manager(l40s_pod: DriverPod) -> None:
    pod = l40s_pod
    log = pod.output
    assert "Using the open kernel modules (requested by KERNEL_MODULE_TYPE)" in log
    assert "kernel interface matches." in log
    assert "Building kernel modules" not in log
    assert "No NVSwitch devices found, skipping NVIDIA fabric manager daemon" in log
    assert "Starting NVIDIA fabric manager daemon" not in log
    assert not pod.calls("nv-fabricmanager")
    assert not (pod.run_fabricmanager / "nv-fabricmanager.pid").exists()
    assert (pod.run_nvidia / "validations/.driver-daemons-status").read_text() == "Ready\n"
    assert pod.probe().returncode == 0
    _assert_stops_cleanly(pod, _daemon_pids(pod))


def test_the_gsp_firmware_reaches_the_host_through_the_driver_root(l40s_pod: DriverPod) -> None:
    """The kernel loads gsp_*.bin from the host path the search path names."""
    directory = l40s_pod.driver_root / f"lib/firmware/nvidia/{DRIVER}"
    firmware = sorted(path.name for path in directory.glob("*"))
    assert firmware, f"no GSP firmware in {directory}"
    assert all(name.startswith("gsp_") and name.endswith(".bin") for name in firmware)
    # ...and it was already there when nvidia.ko was loaded.
    [seen] = [line for line in l40s_pod.calls("firmware") if "gsp_" in line] or [""]
    assert f"nvidia/{DRIVER}/gsp_" in seen


def test_the_startup_probe_fails_until_modules_and_daemons_are_ready(l40s_pod: DriverPod) -> None:
    pod = l40s_pod
    status = pod.run_nvidia / "validations/.driver-daemons-status"
    ready = pod.run_nvidia / "validations/.driver-ctr-ready"
    # As init leaves it until its daemons run.
    status.write_text("NotReady\n")
    probe = pod.probe()
    assert probe.returncode == 1
    assert probe.stdout.strip() == "NVIDIA driver daemons are not ready; Current status: NotReady"
    assert not ready.exists()
    status.write_text("Ready\n")
    # As before nvidia.ko is loaded.
    assert pod.exec("mv", "/sim/sys/module/nvidia", "/sim/sys/module/.nvidia").returncode == 0
    probe = pod.probe()
    assert (probe.returncode, probe.stdout.strip()) == (1, "NVIDIA kernel module not loaded")
    assert not ready.exists()
    assert pod.exec("mv", "/sim/sys/module/.nvidia", "/sim/sys/module/nvidia").returncode == 0
    probe = pod.probe()
    assert probe.returncode == 0, probe.stdout
    assert ready.read_text() == CTR_READY


def test_a_mismatched_kernel_builds_at_runtime_then_installs(
    precompiled: str,
    banner: str,
    flatcar_release_server: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
) -> None:
    """A node whose kernel was built at another time: same release string, other banner.

    The build fetches the release's kernel tree from the loopback release server, which only
    host networking reaches (a node reaches Flatcar's servers over its pod network). The
    module type is left to auto (proprietary for 535): on this machine the open modules built
    no faster (about 6.5 and 7 minutes from container start, under the same load).
    """
    node = flatcar_node(mismatched(banner), HGX_H100)
    env = {
        "FLATCAR_RELEASE_BASE_URL": flatcar_release_server.base_url,
        "FLATCAR_KEYRING": KEYRING,
    }
    keyring = flatcar_signing_key.public_keyring
    with driver_pod(precompiled, node, env, network="host", keyring=keyring) as pod:
        pod.wait_for(READY_LINE, timeout=RUNTIME_BUILD_SECONDS)
        log = pod.output
        assert "Checking NVIDIA driver packages..." in log
        assert "kernel interface matches." not in log
        assert "Using the proprietary kernel modules (auto: branch 535" in log
        assert "No precompiled NVIDIA driver package matches kernel" in log
        assert "Building kernel modules" in log
        assert log.index("Building kernel modules") < log.index(
            "Installing NVIDIA driver kernel modules..."
        )
        assert any(line.startswith("insmod ") for line in pod.calls("insmod"))
        assert pod.driver_root_mounted()
        assert pod.probe().returncode == 0
        _assert_stops_cleanly(pod, _daemon_pids(pod))
