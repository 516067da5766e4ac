"""The precompiled image, run as the GPU Operator's driver DaemonSet runs it.

``docker run`` with the DaemonSet's privileges, environment, command and host mounts, on a
simulated node (fixtures/daemonset.py): only the GPU and module loading are stood in for. The
image is the session's precompiled image (conftest.py), shared with test_images.py. Each test
checks what the Operator and its validator see: the log lines, the driver root bind-mounted on
the host's /run/nvidia/driver, the pid and status files, the startup probe, and a clean stop.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from fixtures.daemonset import (
    GB200_TRAY,
    GRACE_SECONDS,
    HGX_H100,
    L40S_SERVER,
    OPERATOR_COMMAND,
    READY_LINE,
    STARTUP_PROBE_SECONDS,
    DriverPod,
    Hardware,
    Node,
    NodeHost,
    driver_pod,
    image_packages,
    mismatched,
    node_host,
)
from fixtures.gpg import SigningKey
from fixtures.images import DRIVER, Invoke
from fixtures.qemu import BROKEN_BUILD, NO_GPU, boot_and_insmod
from fixtures.release_server import BUILD_ARTIFACTS, TEST_RELEASE, FlatcarReleaseServer
from processes import process_gone

from nvidia_driver.kbuild.packages import Package, load_package

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
# The image without the kernel's gcc-14 (it keeps gcc-13 and gcc-15, plain gcc being gcc-15):
# what a precompiled image is on a node whose kernel a gcc it lacks built (fixtures/daemonset.py).
WITHOUT_GCC14 = {"GDC_HIDE": "gcc gcc-14 x86_64-linux-gnu-gcc-14 cc", "GDC_GCC": "gcc-15"}
# Where a pod installs the modules (in the container; /sim/lib/modules through the host root).
MODULES_DIR = f"/usr/lib/modules/{TEST_RELEASE.kernel.release}"


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
        ("nvlsm", "/run/nvidia-fabricmanager/nvlsm.pid"),
    ):
        result = pod.exec("cat", pid_file)
        if result.returncode == 0:
            pids[name] = int(result.stdout)
    return pids


def node_packages(host: NodeHost) -> list[Package]:
    """The packages in the node's /run/nvidia/cache, each of them readable.

    Not iter_packages: it skips a package it cannot read, which here is a failure to name."""
    packages = []
    for metadata in sorted((host.base / "run-nvidia/cache/packages").rglob("metadata.json")):
        package = load_package(metadata.parent)
        assert package is not None, metadata
        packages.append(package)
    return packages


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


@pytest.fixture(scope="module")
def rebuilt_node(banner: str, flatcar_signing_key: SigningKey) -> Iterator[tuple[Node, NodeHost]]:
    """A node whose kernel was built at another time: same release string, other banner.

    Its host paths are shared by the tests that build, as restarted pods on the same node: the
    one interrupted by a SIGTERM, the one that completes, and the one that finds its package.
    """
    node = flatcar_node(mismatched(banner), HGX_H100)
    with node_host(node, keyring=flatcar_signing_key.public_keyring) as host:
        yield node, host


BUILD_PATHS = ("/run/nvidia/cache/packages", "/var/cache/nvidia-driver")


def _processes_under(directory: Path) -> list[str]:
    """Command lines of live processes that name a path under directory (a compiler's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # The compile runs in the work directory (NVIDIA_DRIVER_WORK_DIR), its package lands
        # in the cache.
        if any(path in cmdline for path in (str(directory), *BUILD_PATHS)):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def test_a_sigterm_in_the_middle_of_a_runtime_build_ends_within_the_grace_period(
    precompiled: str,
    rebuilt_node: tuple[Node, NodeHost],
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    """The kubelet's SIGTERM while make runs: out in 30 s, nothing half-built or installed.

    The image's own gcc-14 compiles here, so the compilers' command lines name the work and
    cache directories the last checks look for (a chrooted compiler's name the chroot's).
    """
    node, host = rebuilt_node
    env = flatcar_release_server.container_env()
    with driver_pod(precompiled, node, env, network="host", host=host) as pod:
        pod.wait_for("Building kernel modules:", timeout=STARTUP_PROBE_SECONDS)
        time.sleep(2)  # make and its compilers are running
        started = time.monotonic()
        code = pod.stop()
        elapsed = time.monotonic() - started
        after = pod.output.split("Building kernel modules:", 1)[1]
    assert code == 0, pod.output
    assert elapsed < GRACE_SECONDS, f"{elapsed:.1f} s: the kubelet would have killed it"
    assert "Caught signal" in after
    cache = pod.run_nvidia / "cache"
    assert not list(cache.rglob("metadata.json")), "no package from an interrupted build"
    assert not list(cache.rglob(".build.*")), "the build directory is removed"
    assert not _processes_under(cache), "no compiler left running"
    assert not pod.driver_root_mounted()
    assert not (pod.run_nvidia / "nvidia-driver.pid").exists()
    assert (pod.run_nvidia / "validations/.driver-daemons-status").read_text() == "NotReady\n"
    assert not (pod.run_nvidia / "nvidia-driver.state").exists()


def test_a_mismatched_kernel_without_the_images_gcc_builds_in_the_developer_container(
    precompiled: str,
    rebuilt_node: tuple[Node, NodeHost],
    flatcar_release_server: FlatcarReleaseServer,
    tmp_path: Path,
) -> None:
    """A new pod on the node the last test left, from an image without the kernel's gcc-14.

    That is the image on a node whose kernel a newer gcc built (a future gcc 16): no package
    matches, so the pod builds at runtime, in the release's developer container with its own
    gcc-14. The build fetches the release's artifacts from the loopback release server, which
    only host networking reaches (a node reaches Flatcar's servers over its pod network). The
    module type is left to auto (proprietary for 535), so the closed core is linked on the node;
    the nvidia.ko the pod installed is then insmod-ed into the release's kernel under QEMU.
    """
    node, host = rebuilt_node
    env = {**flatcar_release_server.container_env(), **WITHOUT_GCC14}
    with driver_pod(precompiled, node, env, network="host", host=host) as pod:
        pod.wait_for(READY_LINE, timeout=STARTUP_PROBE_SECONDS)
        log = pod.output
        assert "Checking NVIDIA driver packages..." in log
        assert "kernel interface matches." not in log
        assert "Using the proprietary kernel modules (auto: branch 535" in log
        assert "No precompiled NVIDIA driver package matches kernel" in log
        assert "no gcc 14 is available in this image" in log
        assert f"using the developer container of Flatcar {TEST_RELEASE.version}" in log
        assert "Building kernel modules" in log
        assert log.index("Building kernel modules") < log.index(
            "Installing NVIDIA driver kernel modules..."
        )
        assert "Linking nvidia.ko from its kernel interface..." in log
        assert any(line.startswith("insmod ") for line in pod.calls("insmod"))
        assert pod.driver_root_mounted()
        assert pod.probe().returncode == 0
        installed = pod.copy_out(f"{MODULES_DIR}/kernel/drivers/video/nvidia.ko",
                                 tmp_path / "nvidia.ko")  # fmt: skip
        image_gcc = pod.exec("/usr/bin/gcc-14", "--version").stdout.splitlines()[0]
        _assert_stops_cleanly(pod, _daemon_pids(pod))
    # The package the pod left in the node's cache: the developer container's gcc-14 (trixie's),
    # not the image's (forky's); the closed core shipped unlinked, linked on the node.
    [package] = node_packages(host)
    assert package.metadata.banner == node.banner
    assert package.metadata.compiler.startswith("gcc-14 (Debian 14."), package.metadata
    assert package.metadata.compiler != image_gcc
    assert "nvidia.ko" not in package.metadata.modules
    assert {linked.module for linked in package.metadata.linked} == {
        "nvidia.ko",
        "nvidia-modeset.ko",
    }
    assert set(package.metadata.referenced) == {"nvidia.core.o_binary",
                                                "nvidia-modeset.core.o_binary"}  # fmt: skip
    assert not list(package.path.glob("*.o_binary"))  # in the image's /usr/src, not in /run
    # Only the package stays: the developer container and the compile went with the pod's
    # writable layer, and nothing in flight is left in the cache.
    assert not [path for path in (host.base / "run-nvidia/cache").rglob("*")
                if path.name.startswith((".scratch-", ".incoming-", ".build."))]  # fmt: skip
    boot = boot_and_insmod([installed], TEST_RELEASE.kernel.release)
    assert NO_GPU in boot.console
    assert boot.load(installed).errno_name == "ENODEV"
    assert not any(error in boot.console for error in BROKEN_BUILD)


def test_the_next_pod_on_that_node_reuses_the_built_package(
    precompiled: str,
    rebuilt_node: tuple[Node, NodeHost],
    flatcar_release_server: FlatcarReleaseServer,
) -> None:
    """After the pod that built stopped (modules unloaded): no compile and no download."""
    node, host = rebuilt_node
    env = {**flatcar_release_server.container_env(), **WITHOUT_GCC14}
    server = flatcar_release_server
    server.reset()  # count only this pod's requests, not the last build's
    host.forget_calls()
    with driver_pod(precompiled, node, env, network="host", host=host) as pod:
        pod.wait_for(READY_LINE, timeout=STARTUP_PROBE_SECONDS)
        log = pod.output
        found = f"Found NVIDIA driver package nvidia-modules-{TEST_RELEASE.kernel.upstream_version}"
        assert found in log
        assert "Building kernel modules" not in log
        assert "developer container" not in log
        assert pod.probe().returncode == 0
        _assert_stops_cleanly(pod, _daemon_pids(pod))
    for artifact in BUILD_ARTIFACTS:
        assert server.request_count(server.artifact_url(artifact)) == 0, artifact
    assert len(node_packages(host)) == 1


# --- HGX, DGX and GB200 nodes; restarts ----------------------------------------------------------


def test_a_gb200_tray_starts_fm_and_nvlsm_and_without_mofed_reaches_done(
    precompiled: str, banner: str
) -> None:
    """NVLink5 with GPUDirect RDMA on Flatcar: no MOFED, so DMA-BUF, and the fabric runs.

    The NVIDIADriver resource's spec.args come after init, as the Operator renders them.
    """
    node = flatcar_node(banner, GB200_TRAY)
    env = {"GPU_DIRECT_RDMA_ENABLED": "true"}
    args = ("--accept-license", "--max-threads", "2")
    with driver_pod(precompiled, node, env, args=args) as pod:
        pod.wait_for(READY_LINE)
        log = pod.output
        assert "Ignoring --accept-license" in log
        assert "Using the open kernel modules (auto: " in log  # Grace-Blackwell needs open
        assert "Detected NVLink5+ system (management ports: mlx5_0, mlx5_1)" in log
        assert "Starting NVIDIA fabric manager daemon for NVLink5+..." in log
        # The image's own start script started NVLSM and the fabric manager from their paths.
        daemons = _daemon_pids(pod)
        assert {"nvlsm", "fabricmanager"} <= set(daemons)
        exe = {name: str(Path(f"/proc/{pid}/exe").readlink()) for name, pid in daemons.items()}
        assert exe["nvlsm"] == "/opt/nvidia/nvlsm/sbin/nvlsm"
        assert exe["fabricmanager"] == "/usr/bin/nv-fabricmanager"
        nvlsm = Path(f"/proc/{daemons['nvlsm']}/cmdline").read_bytes().split(b"\0")
        assert b"/sim/usr/share/nvidia/nvlsm/nvlsm.conf" in nvlsm
        # RDMA: no MOFED tree, so no nvidia-peermem, one line, and the install goes on.
        assert (
            "GPUDirect RDMA is enabled, but /run/mellanox/drivers/usr/src/ofa_kernel is absent"
            in log
        )
        assert "use DMA-BUF instead" in log
        assert not [call for call in pod.calls("insmod") if "nvidia-peermem" in call]
        assert pod.probe().returncode == 0
        _assert_stops_cleanly(pod, daemons)


def test_a_pod_killed_with_sigkill_is_followed_by_one_that_serves_the_node(
    precompiled: str, banner: str
) -> None:
    """No cleanup ran: modules loaded, driver root mounted, stale pid file; the next pod copes.

    Every module is still loaded and the digest is the same, so it takes the fast path.
    """
    node = flatcar_node(banner, L40S_SERVER)
    with node_host(node) as host:
        with driver_pod(precompiled, node, host=host) as first:
            first.wait_for(READY_LINE)
            killed = _daemon_pids(first)
            first.kill()
            assert first.driver_root_mounted(), "SIGKILL: nothing unmounted the driver root"
            assert (first.run_nvidia / "nvidia-driver.pid").exists()
            loaded_before = len(first.calls("insmod"))  # the host's call log outlives pods
        with driver_pod(precompiled, node, host=host) as second:
            second.wait_for(READY_LINE)
            log = second.output
            assert "performing userspace-only install" in log
            assert "Unmounting NVIDIA driver rootfs..." in log  # what the killed pod left
            assert "Userspace-only install complete" in log
            assert second.driver_root_mounted()
            assert second.probe().returncode == 0
            assert len(second.calls("insmod")) == loaded_before, "the fast path loads nothing"
            daemons = _daemon_pids(second)
            _assert_stops_cleanly(second, daemons)
    for name, pid in killed.items():
        assert process_gone(pid), f"the killed pod's {name} (pid {pid}) still runs"


# The driver container as the real GPU Operator v25.3.4 renders it (the cluster session checks
# the file against the Operator: tests/integration/data/README.md).
RENDERED = Path(__file__).parent / "data" / "gpu-operator-v25.3.4-nvidia-driver-ctr.json"


def test_the_driver_container_the_real_operator_v25_3_4_renders_reaches_ready(
    precompiled: str, banner: str
) -> None:
    """Its command, its env (no DRIVER_CONFIG_DIGEST before v26; the downward API's values as
    the harness's node has them), its mounts (each one the harness provides, or a path under
    one), its inline startup probe and its preStop hook."""
    rendered = json.loads(RENDERED.read_text())
    assert (*rendered["command"], *rendered.get("args", [])) == OPERATOR_COMMAND
    env: dict[str, str | None] = {item["name"]: item["value"] for item in rendered["env"]
                                  if "value" in item}  # fmt: skip
    env["DRIVER_CONFIG_DIGEST"] = None  # the Operator sets none before v26
    node = flatcar_node(banner, L40S_SERVER)
    with node_host(node) as host, driver_pod(precompiled, node, env, host=host) as pod:
        provided = [option.split("dst=", 1)[1].split(",", 1)[0]
                    for option in host.mounts]  # fmt: skip
        for mount in rendered["volumeMounts"]:
            path = mount["mountPath"]
            assert any(path == dst or path.startswith(f"{dst}/") for dst in provided), path
        pod.wait_for(READY_LINE)
        probe = pod.exec(*rendered["startupProbe"]["exec"]["command"])
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert (pod.run_nvidia / "validations/.driver-ctr-ready").exists()
        pre_stop = pod.exec(*rendered["lifecycle"]["preStop"]["exec"]["command"])
        assert pre_stop.returncode == 0
        assert not (pod.run_nvidia / "validations/.driver-ctr-ready").exists()
        assert pod.stop() == 0, pod.output
