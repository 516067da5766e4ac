"""``nvidia-driver init`` end to end on simulated hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fetch_server import ReleaseServer
from processes import process_gone
from simhost import (
    BANNER,
    DRIVER,
    FLATCAR_OS_RELEASE_QUOTED,
    GB200,
    H100,
    KERNEL,
    L40S,
    V100,
    RunningDriver,
    SimulatedHost,
)

from nvidia_driver.kbuild.packages import LinkedModule, PackageMetadata, write_package

INSTALL_LINES = [
    "Checking NVIDIA driver packages...",
    "kernel interface matches.",
    "Found NVIDIA driver package nvidia-modules-6.12.81",
    "Installing NVIDIA driver kernel modules...",
    "Loading NVIDIA driver kernel modules...",
    "Starting NVIDIA persistence daemon...",
    "Starting NVIDIA fabric manager daemon...",
    "Done, now waiting for signal",
]


def init_waiting(host: SimulatedHost, *args: str, **env: str) -> RunningDriver:
    """``init`` started, once it waits for a signal."""
    driver = host.start("init", *args, **env)
    driver.wait_for("Done, now waiting for signal")
    return driver


def in_order(output: str, expected: list[str]) -> bool:
    position = 0
    for line in expected:
        found = output.find(line, position)
        if found < 0:
            return False
        position = found + len(line)
    return True


def loaded_in_order(host: SimulatedHost) -> list[str]:
    return [call.split()[1] for call in host.calls("modprobe") if "-d" not in call.split()]


def test_h100_with_nvswitch_installs_the_matching_package_and_starts_the_fabric_manager(
    host: SimulatedHost,
) -> None:
    host.add_gpus(H100, count=8)
    host.add_nvswitches(4)
    host.add_package("open")
    host.add_package("proprietary")
    driver = init_waiting(host, NVFM_CONFIG_FABRIC_MODE="1", NVFM_CONFIG_LOG_FILE_NAME="")

    assert in_order(driver.output, INSTALL_LINES), driver.output
    assert "Using the open kernel modules (auto: branch 580" in driver.output
    assert loaded_in_order(host) == ["nvidia", "nvidia-uvm", "nvidia-modeset"]
    installed = host.path(f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko")
    assert installed.read_text() == "open nvidia.ko\n"
    assert host.calls("depmod") == [f"depmod -b {host.root} {KERNEL}"]
    assert not host.calls("make"), "a matching package must not compile"
    # The fabric manager ran with the NVFM_CONFIG_* overrides applied.
    seen = (host.state / "fabricmanager.cfg.seen").read_text().splitlines()
    assert "FABRIC_MODE=1" in seen
    assert "LOG_FILE_NAME=" in seen
    assert "# FABRIC_MODE=2" in seen, "comments stay as they are"
    # NotReady while the daemons start, Ready once they are up.
    assert "daemons-status-at-start NotReady" in host.calls("daemons-status-at-start")
    assert host.path("/run/nvidia/validations/.driver-daemons-status").read_text() == "Ready\n"
    assert f"none {host.path('/run/nvidia/driver')} none" in host.path("/proc/mounts").read_text()
    assert host.path("/run/nvidia/nvidia-driver.pid").read_text().strip().isdigit()

    assert driver.terminate() == 0
    assert "Caught signal" in driver.output
    assert host.calls("rmmod") == ["rmmod nvidia_modeset nvidia_uvm nvidia"]
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()
    assert str(host.path("/run/nvidia/driver")) not in host.path("/proc/mounts").read_text()
    assert all(process_gone(pid) for pid in host.daemon_pids())


def test_a_banner_one_character_off_does_not_match_and_builds_at_runtime(
    host: SimulatedHost,
) -> None:
    host.add_package("open", banner=BANNER[:-1] + "7")  # built in 2027, not 2026
    host.add_host_kernel_tree()
    # The host's tree is copied to the container's disk (never built in place on the host).
    tree = host.path(f"/var/cache/nvidia-driver/trees/host-{KERNEL}/usr/lib/modules/{KERNEL}/build")
    driver = init_waiting(host)

    assert "kernel interface matches." not in driver.output
    assert "building one" in driver.output
    [make] = host.calls("make")
    assert f"SYSSRC={tree}" in make
    assert f"SYSOUT={tree}" in make
    assert "CC=gcc-14" in make
    # The compiler is chosen once for the build: asked its version, then its version line.
    assert host.calls("gcc-14") == ["gcc-14 -dumpfullversion -dumpversion", "gcc-14 --version"]
    assert "Building kernel modules:" in driver.output
    assert "[##############################] 100%" in driver.output
    installed = host.path(f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko")
    assert installed.read_text() == "built nvidia\n"
    # The build is cached under /run/nvidia with the exact banner: a restart reuses it.
    assert driver.terminate() == 0
    again = init_waiting(host)
    assert "Found NVIDIA driver package nvidia-modules-6.12.81" in again.output
    assert len(host.calls("make")) == 1
    assert again.terminate() == 0


def _cached_package(host: SimulatedHost, module_type: str) -> Path:
    [metadata] = host.path(f"/run/nvidia/cache/packages/{DRIVER}/{module_type}").glob(
        "*/metadata.json"
    )
    return metadata


def test_a_cached_package_from_other_driver_sources_is_rebuilt(host: SimulatedHost) -> None:
    host.add_host_kernel_tree()
    first = init_waiting(host)
    assert first.terminate() == 0
    built = json.loads(_cached_package(host, "open").read_text())
    assert built["source_digest"].startswith("sha256:")

    # An image update ships other sources (or patches) for the same driver version.
    host.write(f"/usr/src/nvidia-{DRIVER}/kernel-open/nv.c", "/* fixed */\n")
    second = init_waiting(host)
    assert second.terminate() == 0
    assert "building one" in second.output
    assert len(host.calls("make")) == 2
    rebuilt = json.loads(_cached_package(host, "open").read_text())
    assert rebuilt["source_digest"] != built["source_digest"]

    # The same sources again: the rebuilt package is reused.
    third = init_waiting(host)
    assert third.terminate() == 0
    assert "Found NVIDIA driver package nvidia-modules-6.12.81" in third.output
    assert len(host.calls("make")) == 2


def test_a_damaged_cached_package_is_built_again(host: SimulatedHost) -> None:
    host.add_host_kernel_tree()
    first = init_waiting(host)
    assert first.terminate() == 0
    metadata = _cached_package(host, "open")
    package = metadata.parent
    module = package / min(json.loads(metadata.read_text())["files"])
    module.write_bytes(module.read_bytes() + b"\0")  # a changed byte in /run: a bad RAM page

    second = init_waiting(host)
    assert second.terminate() == 0
    warning = (f"cached package {package} is damaged ({module.relative_to(package)} is missing "
               "or does not match its SHA-256): building it again")  # fmt: skip
    assert warning in second.output
    assert len(host.calls("make")) == 2
    assert _cached_package(host, "open") == metadata  # rebuilt in its place, healthy again
    third = init_waiting(host)
    assert third.terminate() == 0
    assert "is damaged" not in third.output
    assert len(host.calls("make")) == 2


def test_precompiled_packages_match_by_banner_whatever_their_sources(
    host: SimulatedHost,
) -> None:
    host.add_package("open")  # source_digest "sha256:0": not these sources
    driver = init_waiting(host)
    assert driver.terminate() == 0
    assert "Found NVIDIA driver package nvidia-modules-6.12.81" in driver.output
    assert not host.calls("make")


def test_proprietary_packages_are_linked_on_the_node(host: SimulatedHost) -> None:
    host.add_host_kernel_tree()
    driver = init_waiting(host, KERNEL_MODULE_TYPE="proprietary")
    # Debug info is stripped from what is packaged, NVIDIA's closed core objects aside.
    [strip] = host.calls("strip")
    stripped = sorted(Path(arg).name for arg in strip.split()[2:])
    assert stripped == sorted([
        "nvidia-drm.ko", "nvidia-peermem.ko", "nvidia-uvm.ko",
        "nv-interface.o", "nvidia.mod.o", "nv-modeset-interface.o", "nvidia-modeset.mod.o",
    ])  # fmt: skip
    assert json.loads(_cached_package(host, "proprietary").read_text())["debug_info_stripped"]
    links = host.calls("ld")
    assert len(links) == 2
    assert "nvidia.interface.o" in links[0]
    # NVIDIA's core object is linked from the driver's sources: the package only references it.
    core = host.path(f"/usr/src/nvidia-{DRIVER}/kernel/nvidia/nv-kernel.o_binary")
    assert str(core) in links[0].split()
    assert not list(_cached_package(host, "proprietary").parent.glob("*.o_binary"))
    assert "-T" in links[0].split()
    video = host.path(f"/lib/modules/{KERNEL}/kernel/drivers/video")
    assert (video / "nvidia.ko").read_text() == "linked\n"
    assert (video / "nvidia-uvm.ko").read_text() == "built nvidia-uvm\n"
    assert driver.terminate() == 0


def test_a_precompiled_package_whose_core_object_differs_is_built_on_the_node(
    host: SimulatedHost,
) -> None:
    host.add_host_kernel_tree()
    sources = host.path(f"/usr/src/nvidia-{DRIVER}")
    interface = host.write("/tmp/nv-interface.o", "interface\n")
    metadata = PackageMetadata(
        banner=BANNER, kernel_release=KERNEL, driver_version=DRIVER, module_type="proprietary",
        compiler="gcc-14", source_digest="sha256:0", modules=[],
        linked=[LinkedModule("nvidia.ko", ["nvidia.interface.o", "nvidia.core.o_binary"])],
        referenced={"nvidia.core.o_binary": "kernel/nvidia/nv-kernel.o_binary"},
    )  # fmt: skip
    package = host.path(f"/opt/nvidia/precompiled/proprietary/{KERNEL}")
    write_package(package, metadata, {"nvidia.interface.o": interface}, sources)
    # Another image's core object under the same driver version: never linked with this package.
    core = host.write(f"/usr/src/nvidia-{DRIVER}/kernel/nvidia/nv-kernel.o_binary", "other\n")

    driver = init_waiting(host, KERNEL_MODULE_TYPE="proprietary")

    assert (f"WARNING: package {package} does not fit this image's driver sources: {core} does "
            "not match the SHA-256 the package recorded") in driver.output  # fmt: skip
    assert ("No precompiled NVIDIA driver package matches kernel 6.12.81-flatcar (its package "
            "for this kernel does not fit the image's driver sources); building one"
            ) in driver.output  # fmt: skip
    assert len(host.calls("make")) == 1
    assert driver.terminate() == 0


def test_l40s_node_skips_the_fabric_manager(host: SimulatedHost) -> None:
    host.add_gpus(L40S, count=2)
    host.add_package("open")
    driver = init_waiting(host)
    assert "No NVSwitch devices found, skipping NVIDIA fabric manager daemon" in driver.output
    assert "Starting NVIDIA fabric manager daemon" not in driver.output
    assert not host.calls("nv-fabricmanager")
    assert driver.terminate() == 0


def test_digest_fast_path_keeps_the_loaded_modules(host: SimulatedHost) -> None:
    for module in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        host.set_module(module, 1 if module == "nvidia" else 0)
    host.set_module("nvidia", 2)
    host.write("/run/nvidia/nvidia-driver.state", "digest-1234")
    driver = init_waiting(host, DRIVER_CONFIG_DIGEST="digest-1234")
    assert "performing userspace-only install" in driver.output
    assert "Userspace-only install complete" in driver.output
    assert not host.calls("rmmod")
    assert loaded_in_order(host) == []
    assert not host.calls("depmod")
    assert host.calls("nvidia-persistenced")
    assert host.path("/run/nvidia/validations/.driver-daemons-status").read_text() == "Ready\n"
    driver.terminate()


def test_a_new_digest_reinstalls(host: SimulatedHost) -> None:
    host.set_module("nvidia", 0)
    host.write("/run/nvidia/nvidia-driver.state", "old-digest")
    host.add_package("open")
    driver = init_waiting(host, DRIVER_CONFIG_DIGEST="new-digest")
    assert host.calls("rmmod") == ["rmmod nvidia"]
    assert host.path("/run/nvidia/nvidia-driver.state").read_text() == "new-digest"
    driver.terminate()


def test_a_kill_between_loading_and_storing_the_digest_leaves_no_stale_digest(
    host: SimulatedHost,
) -> None:
    """The state file names the configuration of the loaded modules: once init unloads the
    old ones it no longer does, and k8s-driver-manager (shouldSkipUninstall) and the fast path
    of a pod with the old digest must not trust it for the new ones."""
    for module in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        host.set_module(module)
    host.write("/run/nvidia/nvidia-driver.state", "old-digest")
    host.add_package("open")
    hanging = host.bin_dir / "nvidia-persistenced"
    # Where the grace period runs out: init is killed while the daemon starts.
    hanging.write_text('#!/bin/bash\necho $$ > "$STUB_STATE/hanging.pid"\nexec sleep 300\n')
    driver = host.start("init", DRIVER_CONFIG_DIGEST="new-digest")
    hanging_pid = host.state / "hanging.pid"
    deadline = time.monotonic() + 30
    while not (hanging_pid.exists() and hanging_pid.read_text().strip()):
        assert time.monotonic() < deadline, "the daemon was not started"
        time.sleep(0.05)
    driver.process.kill()
    driver.finish()
    os.kill(int(hanging_pid.read_text()), signal.SIGKILL)
    assert host.calls("rmmod") == ["rmmod nvidia_modeset nvidia_uvm nvidia"]
    assert host.is_loaded("nvidia"), "the new modules stay loaded"
    assert not host.path("/run/nvidia/nvidia-driver.state").exists()


def test_a_stale_fabric_manager_pid_file_is_removed_without_signalling_its_pid(
    host: SimulatedHost,
) -> None:
    """/run/nvidia-fabricmanager is a host path: a pod killed without its shutdown leaves the
    pid file there, and under hostPID its pid may since be any process of the node."""
    host.add_package("open")
    other = subprocess.Popen(["sleep", "300"])  # the node's process that now has that pid
    try:
        host.write("/var/run/nvidia-fabricmanager/nv-fabricmanager.pid", f"{other.pid}\n")
        driver = init_waiting(host)
        assert other.poll() is None, "a process that is not the fabric manager was signalled"
        assert "Stopping NVIDIA fabric manager daemon..." not in driver.output
        assert (
            "Removing the stale pid file of the NVIDIA fabric manager daemon: pid "
            f"{other.pid} is not nv-fabricmanager" in driver.output
        )
        assert not host.path("/var/run/nvidia-fabricmanager/nv-fabricmanager.pid").exists()
        assert driver.terminate() == 0
    finally:
        other.kill()
        other.wait()


def test_sigterm_with_busy_modules_leaves_them_loaded(host: SimulatedHost) -> None:
    host.add_package("open")
    driver = init_waiting(host)
    host.set_module("nvidia_uvm", 1)  # a CUDA process holds the GPU

    assert driver.terminate() == 0
    assert "Could not unload NVIDIA driver kernel modules, driver is in use" in driver.output
    assert not host.calls("rmmod")
    assert host.is_loaded("nvidia")
    assert host.is_loaded("nvidia_uvm")
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()
    assert all(process_gone(pid) for pid in host.daemon_pids())


def test_a_second_init_is_refused_while_one_runs(host: SimulatedHost) -> None:
    host.add_package("open")
    first = init_waiting(host)
    second = host.run("init")
    assert second.returncode == 1
    assert "An instance of the NVIDIA driver is already running, aborting" in second.stderr
    assert len(host.calls("nvidia-persistenced")) == 1
    assert first.terminate() == 0


def test_failure_halfway_cleans_up_completely(host: SimulatedHost) -> None:
    host.add_nvswitches(2)
    host.add_package("open")
    host.fail("nv-fabricmanager", "NV_WARN_NOTHING_TO_DO: no fabric to manage")
    result = host.run("init", DRIVER_CONFIG_DIGEST="d1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ERROR: nv-fabricmanager failed (exit 1): NV_WARN_NOTHING_TO_DO: no fabric to manage"
    )
    assert "Cleaning up after the failure..." in result.stdout
    assert "Stopping NVIDIA persistence daemon..." in result.stdout
    assert all(process_gone(pid) for pid in host.daemon_pids())
    assert host.calls("rmmod") == ["rmmod nvidia_modeset nvidia_uvm nvidia"]
    assert not host.is_loaded("nvidia")
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()
    assert not host.path("/run/nvidia/nvidia-driver.state").exists()
    assert not host.calls("mount")
    assert host.path("/run/nvidia/validations/.driver-daemons-status").read_text() == ("NotReady\n")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda h: h.set_lockdown("integrity"),
            "Secure Boot lockdown is active (lockdown=integrity)",
        ),
        (lambda h: h.set_module("nouveau"), "the nouveau driver is loaded"),
        (
            lambda h: [p.unlink() for p in h.path("/sys/bus/pci/devices").rglob("vendor")],
            "No NVIDIA GPU found on this node",
        ),
        (
            lambda h: h.write("/host-etc/os-release", 'ID=ubuntu\nPRETTY_NAME="Ubuntu 24.04"\n'),
            "this image is for Flatcar Container Linux, but the host is Ubuntu 24.04",
        ),
    ],
    ids=["lockdown", "nouveau", "no-gpu", "not-flatcar"],
)
def test_refusals_say_why_and_what_to_do(host: SimulatedHost, setup: object, message: str) -> None:
    assert callable(setup)
    setup(host)
    result = host.run("init")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("ERROR: ")
    assert message in line
    assert not host.calls("modprobe")
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()


def test_lockdown_refusal_points_to_the_signed_sysexts(host: SimulatedHost) -> None:
    host.set_lockdown("confidentiality")
    result = host.run("init")
    assert "nvidia-drivers sysexts" in result.stderr
    assert "driver.enabled=false" in result.stderr


def test_missing_driver_version_is_refused(host: SimulatedHost) -> None:
    result = host.run("init", DRIVER_VERSION="")
    assert result.returncode == 1
    assert result.stderr.startswith("ERROR: missing DRIVER_VERSION")


def test_invalid_module_type_names_the_variable_and_accepted_values(host: SimulatedHost) -> None:
    result = host.run("init", KERNEL_MODULE_TYPE="closed")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "ERROR: invalid value for KERNEL_MODULE_TYPE: 'closed' (accepted: auto, open, proprietary)"
    )


@pytest.mark.parametrize(
    ("gpus", "expected", "reason"),
    [
        ([H100], "open", "auto: branch 580 with Turing or newer GPUs uses open"),
        ([V100], "proprietary", "predate Turing (no GSP), open is ruled out"),
        ([GB200], "open", "(self-hosted Grace) require open modules"),
        ([H100, V100], "proprietary", "predate Turing (no GSP), open is ruled out"),
    ],
    ids=["h100", "v100", "gb200", "mixed-h100-v100"],
)
def test_auto_module_type_follows_the_gpus(
    host: SimulatedHost, gpus: list[int], expected: str, reason: str
) -> None:
    for device in list(host.path("/sys/bus/pci/devices").iterdir()):
        for name in ("vendor", "device", "class"):
            (device / name).unlink()
    for index, device_id in enumerate(gpus):
        host.add_pci(f"0000:{0x30 + index:02x}:00.0", 0x10DE, device_id, 0x030200)
    host.add_package("open")
    host.add_package("proprietary")
    driver = init_waiting(host)
    assert f"Using the {expected} kernel modules" in driver.output
    assert reason in driver.output
    installed = host.path(f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia-uvm.ko")
    assert installed.read_text() == f"{expected} nvidia-uvm.ko\n"
    driver.terminate()


def test_quoted_os_release_behind_a_relative_symlink(host: SimulatedHost) -> None:
    host.path("/host-etc/os-release").unlink()
    host.set_os_release(FLATCAR_OS_RELEASE_QUOTED, symlink=True)
    host.add_package("open")
    driver = init_waiting(host)
    driver.terminate()
    status = host.run("status")
    assert "Flatcar Container Linux by Kinvolk 4757.1.0 (VERSION_ID 4757.1.0)" in status.stdout


def test_module_parameters_and_firmware_path(host: SimulatedHost) -> None:
    host.write("/drivers/nvidia.conf", "NVreg_EnableStreamMemOPs=1\nNVreg_RegistryDwords=A=1")
    host.write("/drivers/nvidia-uvm.conf", "uvm_perf_prefetch_enable=0\n")
    host.add_package("open")
    driver = init_waiting(host)
    assert host.path("/etc/modprobe.d/nvidia.conf").read_text() == (
        "options nvidia NVreg_CoherentGPUMemoryMode=driver NVreg_EnableStreamMemOPs=1 "
        "NVreg_RegistryDwords=A=1\n"
    )
    assert host.path("/etc/modprobe.d/nvidia-uvm.conf").read_text() == (
        "options nvidia-uvm uvm_perf_prefetch_enable=0\n"
    )
    firmware = host.path("/sys/module/firmware_class/parameters/path")
    assert firmware.read_text() == "/run/nvidia/driver/lib/firmware"
    # The image's GSP firmware is in the Operator's /lib/firmware mount before nvidia.ko loads.
    assert in_order(
        driver.output,
        [f"Copying the GSP firmware into /lib/firmware/nvidia/{DRIVER}...", "Loading NVIDIA"],
    )
    gsp = host.path(f"/lib/firmware/nvidia/{DRIVER}/gsp_ga10x.bin")
    assert gsp.read_text() == f"gsp_ga10x.bin of {DRIVER}\n"
    driver.terminate()


def test_an_existing_firmware_search_path_is_kept(host: SimulatedHost) -> None:
    host.write("/sys/module/firmware_class/parameters/path", "/opt/firmware\n")
    host.add_package("proprietary", driver="550.163.01")
    driver = init_waiting(host, DRIVER_VERSION="550.163.01")
    assert "Retaining the current configuration" in driver.output
    # This image has no firmware for 550: proprietary modules go on without GSP.
    assert "WARNING: the image has no GSP firmware for driver 550.163.01" in driver.output
    assert host.path("/sys/module/firmware_class/parameters/path").read_text() == (
        "/opt/firmware\n"
    )
    # Branch 550 gets no CDMM parameter.
    assert not host.path("/etc/modprobe.d/nvidia.conf").exists()
    driver.terminate()


def test_selinux_enforcing_host_gets_the_driver_root_relabelled(host: SimulatedHost) -> None:
    host.write("/sys/fs/selinux/enforce", "1\n")
    host.add_package("open")
    driver = init_waiting(host)
    assert host.calls("chcon") == [
        f"chcon -R -t container_file_t {host.path('/run/nvidia/driver/dev')}"
    ]
    driver.terminate()


def test_load_never_compiles(host: SimulatedHost) -> None:
    host.add_host_kernel_tree()
    result = host.run("load")
    assert result.returncode == 1
    assert "no precompiled package for kernel 6.12.81-flatcar" in result.stderr
    assert not host.calls("make")


def test_build_packages_without_loading(host: SimulatedHost, tmp_path: object) -> None:
    host.add_host_kernel_tree()
    output = host.root.parent / "out"
    result = host.run("build", "--module-type", "open", "--output", str(output))
    assert result.returncode == 0, result.stderr
    copied = output / "open" / f"{KERNEL}-{_banner_key()}"
    assert (copied / "metadata.json").is_file()
    assert not host.calls("modprobe")
    assert f"DRIVER {DRIVER}" not in result.stdout
    # Again into the same place: the cached package, its copy replaced whole.
    (copied / "nvidia.ko").write_text("stale\n")
    again = host.run("build", "--module-type", "open", "--output", str(output))
    assert again.returncode == 0, again.stderr
    assert list((output / "open").iterdir()) == [copied]
    assert (copied / "nvidia.ko").read_text() == "built nvidia\n"


def _banner_key() -> str:
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(BANNER.encode()).hexdigest()[:12]


def test_build_for_an_uncompiled_gcc_names_the_compilers(
    host: SimulatedHost, tmp_path: Path
) -> None:
    host.add_host_kernel_tree(gcc=150201)
    # A release server on loopback that has no developer container (404, not retried): no
    # network, and no backoff against an unreachable flatcar.org.
    with ReleaseServer(tmp_path / "release") as server:
        result = host.run("build", "--module-type", "open",
                          FLATCAR_RELEASE_BASE_URL=server.url("{channel}"))  # fmt: skip
    assert result.returncode == 1
    assert "the kernel was built with gcc 15 and no gcc 15 is available" in result.stderr


def test_unload_refuses_while_modules_are_in_use(host: SimulatedHost) -> None:
    host.set_module("nvidia", 3)
    host.set_module("nvidia_uvm", 1)
    result = host.run("unload")
    assert result.returncode == 1
    assert "Could not unload NVIDIA driver kernel modules, driver is in use" in result.stderr
    assert host.is_loaded("nvidia")


def test_unload_removes_idle_modules(host: SimulatedHost) -> None:
    host.set_module("nvidia", 1)
    host.set_module("nvidia_uvm", 0)
    result = host.run("unload")
    assert result.returncode == 0, result.stderr
    assert host.calls("rmmod") == ["rmmod nvidia_uvm nvidia"]


def test_two_releases_of_one_kernel_share_an_image_and_both_nodes_match(
    host: SimulatedHost,
) -> None:
    """As the precompiled image of one kernel is built: one package per release, side by side."""
    import shutil  # noqa: PLC0415

    banners = (BANNER, BANNER.replace("2026", "2025"))  # one kernel built twice: two banners
    assert banners[0] != banners[1]
    host.add_host_kernel_tree()
    output = host.root.parent / "out"
    for banner in banners:
        host.set_kernel(KERNEL, banner)
        result = host.run("build", "--module-type", "open", "--output", str(output))
        assert result.returncode == 0, result.stderr
    assert len(list((output / "open").glob("*/metadata.json"))) == 2
    shutil.copytree(output, host.path("/opt/nvidia/precompiled"), dirs_exist_ok=True)
    shutil.rmtree(host.path("/run/nvidia/cache"))  # nothing cached: only the image's packages
    compiles = len(host.calls("make"))
    for banner in banners:
        host.set_kernel(KERNEL, banner)
        driver = init_waiting(host)
        assert driver.terminate() == 0
        assert "kernel interface matches." in driver.output
        assert "building one" not in driver.output
    assert len(host.calls("make")) == compiles


# --- HGX, DGX and GB200 nodes ------------------------------------------------------------------


def _nvlink5(host: SimulatedHost) -> None:
    """A GB200 compute tray: Grace-Blackwell GPUs and a ConnectX NVLink5 management port."""
    for device in list(host.path("/sys/bus/pci/devices").iterdir()):
        for name in ("vendor", "device", "class"):
            (device / name).unlink()
    host.add_gpus(GB200, count=4)
    host.add_nvlink5_port("mlx5_0")
    host.set_module("mlx5_core")
    host.set_module("ib_umad")
    host.add_package("open")


def test_a_gb200_node_starts_nvlsm_from_opt_through_the_start_script(host: SimulatedHost) -> None:
    _nvlink5(host)
    host.add_nvlsm()
    driver = init_waiting(host)
    assert "Detected NVLink5+ system (management ports: mlx5_0)" in driver.output
    # The fabric manager's start script, with the arguments NVIDIA's image gives it.
    [start] = host.calls("nvidia-fabricmanager-start.sh")
    assert start == (
        "nvidia-fabricmanager-start.sh --mode start"
        f" --fm-config-file {host.path('/usr/share/nvidia/nvswitch/fabricmanager.cfg')}"
        f" --fm-pid-file {host.path('/var/run/nvidia-fabricmanager/nv-fabricmanager.pid')}"
        f" --nvlsm-config-file {host.path('/usr/share/nvidia/nvlsm/nvlsm.conf')}"
        f" --nvlsm-pid-file {host.path('/var/run/nvidia-fabricmanager/nvlsm.pid')}"
    )
    # ... which ran NVLSM from /opt/nvidia/nvlsm/sbin/nvlsm.
    [nvlsm] = host.calls("nvlsm")
    assert f"--config {host.path('/usr/share/nvidia/nvlsm/nvlsm.conf')}" in nvlsm
    pids = {name: int(host.path(f"/var/run/nvidia-fabricmanager/{name}.pid").read_text())
            for name in ("nvlsm", "nv-fabricmanager")}  # fmt: skip
    assert not any(process_gone(pid) for pid in pids.values())
    status = host.run("status").stdout
    assert "NVLink subnet manager: pid" in status
    assert "/opt/nvidia/nvlsm/sbin/nvlsm (present)" in status
    assert driver.terminate() == 0
    assert "Stopping NVIDIA NVLink subnet manager daemon..." in driver.output
    assert all(process_gone(pid) for pid in pids.values())


def test_a_gb200_node_without_nvlsm_fails_in_one_line(host: SimulatedHost) -> None:
    _nvlink5(host)
    result = host.run("init")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ERROR: this is an NVLink5 node (ports mlx5_0) and this image has no NVLSM "
        "(/opt/nvidia/nvlsm/sbin/nvlsm), without which the fabric manager cannot start: use an "
        f"image built with NVLSM (`invoke record-driver {DRIVER}` records its SHA-256 from "
        "NVIDIA's files in versions.toml; or pass invoke build --redist-sha256 "
        "nvlsm.<arch>=<sha256>)"
    )
    assert not host.calls("nvidia-fabricmanager-start.sh")


def test_rdma_without_mofed_skips_peermem_with_its_line_and_reaches_done(
    host: SimulatedHost,
) -> None:
    host.add_mellanox_nic()
    host.add_package("open")
    driver = init_waiting(host, GPU_DIRECT_RDMA_ENABLED="true")
    assert (
        "GPUDirect RDMA is enabled, but /run/mellanox/drivers/usr/src/ofa_kernel is absent (no "
        "MOFED driver container; there is none for Flatcar): not loading nvidia-peermem, which "
        "needs MOFED's peer-memory symbols; use DMA-BUF instead (the open kernel modules with "
        "the kernel's inbox RDMA drivers)" in driver.output
    )
    assert "nvidia-peermem" not in loaded_in_order(host)
    assert "kernel interface matches." in driver.output  # the precompiled package serves
    assert driver.terminate() == 0


def test_rdma_with_an_ofa_kernel_tree_builds_peermem_against_it(host: SimulatedHost) -> None:
    host.add_mellanox_nic()
    host.add_package("open")  # built without MOFED: not used for this node
    host.add_host_kernel_tree()
    host.add_ofa_kernel()
    driver = init_waiting(host, GPU_DIRECT_RDMA_ENABLED="true")
    assert "nvidia-peermem is built against it" in driver.output
    [make] = host.calls("make")
    ofa_dir = next(arg for arg in make.split() if arg.startswith("OFA_DIR="))
    assert ofa_dir.endswith("/ofa_kernel")
    assert loaded_in_order(host)[-1] == "nvidia-peermem"
    [metadata] = host.path(f"/run/nvidia/cache/packages/{DRIVER}/open").glob(
        "*-mofed/metadata.json"
    )
    assert json.loads(metadata.read_text())["source_digest"].startswith("sha256:")
    assert driver.terminate() == 0
    assert host.calls("rmmod") == ["rmmod nvidia_modeset nvidia_uvm nvidia_peermem nvidia"]
    # A restart finds the MOFED package in the cache: no second compile.
    again = init_waiting(host, GPU_DIRECT_RDMA_ENABLED="true")
    assert len(host.calls("make")) == 1
    assert again.terminate() == 0


def test_the_fast_path_with_only_nvidia_loaded_takes_the_full_install(
    host: SimulatedHost,
) -> None:
    """NVIDIA/gpu-operator#2619: a restart with only nvidia.ko loaded skipped the others."""
    host.set_module("nvidia", 0)
    host.write("/run/nvidia/nvidia-driver.state", "digest-1234")
    host.add_package("open")
    driver = init_waiting(host, DRIVER_CONFIG_DIGEST="digest-1234")
    assert (
        "The NVIDIA driver configuration is unchanged, but nvidia_uvm, nvidia_modeset are not "
        "loaded: performing a full install" in driver.output
    )
    assert "userspace-only install" not in driver.output
    assert host.calls("rmmod") == ["rmmod nvidia"]
    assert loaded_in_order(host) == ["nvidia", "nvidia-uvm", "nvidia-modeset"]
    assert driver.terminate() == 0


def test_init_takes_the_options_the_nvidiadriver_resource_appends(host: SimulatedHost) -> None:
    host.add_host_kernel_tree()
    driver = init_waiting(host, "--accept-license", "-m", "3")
    assert "Ignoring --accept-license: NVIDIA's license was accepted when this image" in (
        driver.output
    )
    assert "Using 3 parallel compile jobs for a runtime build (--max-threads)" in driver.output
    [make] = host.calls("make")
    assert "-j3" in make.split()
    assert driver.terminate() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--kernel", "6.1.0"],
            (
                "nvidia-driver init does not accept --kernel 6.1.0: it accepts "
                "-a/--accept-license and -m/--max-threads N, as NVIDIA's driver container does"
            ),
        ),
        (["-m", "0"], "argument -m/--max-threads: '0' is not a positive number of jobs"),
        (["--max-threads"], "argument -m/--max-threads: expected one argument"),
    ],
    ids=["unknown", "zero-threads", "no-value"],
)
def test_other_options_are_refused_in_one_line(
    host: SimulatedHost, args: list[str], message: str
) -> None:
    result = host.run("init", *args)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("ERROR: ")
    assert message in line
    assert not host.calls("modprobe")


def init_output(host: SimulatedHost) -> str:
    """What an init that reached its Done line, then ended cleanly on SIGTERM, said."""
    driver = init_waiting(host)
    assert driver.terminate() == 0
    return driver.output


def test_an_image_without_nvidia_imex_says_why_it_skips_the_daemon(host: SimulatedHost) -> None:
    host.add_package("open")
    (host.bin_dir / "nvidia-imex").unlink()
    host.write("/proc/1/root/etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n")
    assert (
        "Skipping NVIDIA IMEX daemon: this image has no nvidia-imex (NVIDIA's redist lists no "
        "IMEX for this driver, or versions.toml records no IMEX digest and the image build "
        "left it out)" in init_output(host)
    )


def test_imex_starts_only_on_a_node_configured_for_a_domain(host: SimulatedHost) -> None:
    host.add_package("open")
    host.write("/etc/nvidia-imex/config.cfg", "DAEMONIZE=1\nSERVER_PORT=50000\n")
    assert (
        "Skipping NVIDIA IMEX daemon: the node lists no IMEX domain in "
        "/etc/nvidia-imex/nodes_config.cfg (the NVIDIA DRA driver's ComputeDomains run "
        "nvidia-imex from the driver root" in init_output(host)
    )
    host.write("/proc/1/root/etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n")
    second = init_waiting(host)
    assert "Starting NVIDIA IMEX daemon for a domain of 2 node(s)..." in second.output
    seen_file = host.state / "imex.cfg.seen"  # written by the daemon, which runs on its own
    for _ in range(100):
        if seen_file.exists():
            break
        time.sleep(0.05)
    seen = seen_file.read_text().splitlines()
    assert "DAEMONIZE=0" in seen
    assert f"IMEX_NODE_CONFIG_FILE={host.path('/var/run/nvidia-imex/nodes_config.cfg')}" in seen
    pid = int(host.path("/var/run/nvidia-imex/nvidia-imex.pid").read_text())
    assert not process_gone(pid)
    assert second.terminate() == 0
    assert "Stopping NVIDIA IMEX daemon..." in second.output
    assert process_gone(pid)


def test_module_parameters_other_than_name_value_are_refused(host: SimulatedHost) -> None:
    host.write("/drivers/nvidia.conf", "NVreg_EnableStreamMemOPs=1 -C /tmp/evil.conf\n")
    host.add_package("open")
    result = host.run("init")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ERROR: /drivers/nvidia.conf holds '-C', which is not a module parameter (name=value): "
        "only name=value tokens are accepted; fix the kernel module parameters ConfigMap"
    )
    assert not host.path("/etc/modprobe.d/nvidia.conf").exists()
