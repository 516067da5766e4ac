"""Every path the entrypoint touches, resolved under one root.

In production the root is ``/``: the container's own filesystem, with the host's ``/proc`` and
``/sys`` (the pod is privileged and shares the host PID namespace) and the Operator's mounts
(``/run/nvidia``, ``/host-etc/os-release``, ``/drivers``...). Tests point the root at a
simulated host in a temporary directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.safetext import check
from nvidia_driver.settings import NVIDIA_DRIVER_HOST_ROOT

# The driver root the GPU Operator's validator, toolkit and device plugin read.
DRIVER_ROOT = "/run/nvidia/driver"
FABRICMANAGER_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
NVLSM_CONFIG = "/usr/share/nvidia/nvlsm/nvlsm.conf"
# Where the fabric manager's start script runs NVLSM from (it aborts without it).
NVLSM_BINARY = "/opt/nvidia/nvlsm/sbin/nvlsm"
IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
# MOFED's kernel tree, mounted from the network operator's driver container (HostToContainer).
OFA_KERNEL = "/run/mellanox/drivers/usr/src/ofa_kernel"
# Where the image keeps the GSP firmware: the Operator mounts a host path over /lib/firmware.
IMAGE_FIRMWARE_DIR = "/opt/lib/firmware/nvidia"
FIRMWARE_DIR = "/lib/firmware/nvidia"


class Under:
    """A fixed path under the root: ``paths.mounts`` is ``paths("/proc/mounts")``."""

    def __init__(self, absolute: str) -> None:
        self.absolute = absolute

    def __get__(self, paths: Paths, owner: type[Paths]) -> Path:
        return paths(self.absolute)


@dataclass(frozen=True)
class Paths:
    root: Path

    @classmethod
    def from_env(cls, flag: str | None, env: dict[str, str] | None = None) -> Paths:
        environ = os.environ if env is None else env
        root = flag or environ.get(NVIDIA_DRIVER_HOST_ROOT) or "/"
        # Every path under it reaches command lines, daemons' configs and log lines.
        check(
            root,
            "the host root",
            f"give --host-root or {NVIDIA_DRIVER_HOST_ROOT} a path on one line",
        )
        return cls(Path(root))

    def __call__(self, absolute: str) -> Path:
        """The path ``absolute`` under the root."""
        return self.root / absolute.lstrip("/")

    host_os_release = Under("/host-etc/os-release")
    # With hostPID, PID 1's root is the host's /.
    host_filesystem = Under("/proc/1/root")
    proc_version = Under("/proc/version")
    # uname -r is not namespaced; this file is the same fact, readable under the root.
    kernel_osrelease = Under("/proc/sys/kernel/osrelease")
    mounts = Under("/proc/mounts")
    pci_devices = Under("/sys/bus/pci/devices")
    nvswitch_devices = Under("/proc/driver/nvidia-nvswitch/devices")
    infiniband = Under("/sys/class/infiniband")
    lockdown = Under("/sys/kernel/security/lockdown")
    selinux_enforce = Under("/sys/fs/selinux/enforce")
    sys_module = Under("/sys/module")
    firmware_search_path = Under("/sys/module/firmware_class/parameters/path")
    run_nvidia = Under("/run/nvidia")
    pid_file = Under("/run/nvidia/nvidia-driver.pid")
    state_file = Under("/run/nvidia/nvidia-driver.state")
    validations = Under("/run/nvidia/validations")
    daemons_status = Under("/run/nvidia/validations/.driver-daemons-status")
    driver_ctr_ready = Under("/run/nvidia/validations/.driver-ctr-ready")
    driver_root = Under(DRIVER_ROOT)
    # Under /run/nvidia (a hostPath) so that a restarted pod finds what it built before.
    build_cache = Under("/run/nvidia/cache")
    # In the container's own writable layer, on the node's disk: large transient material
    # (kernel trees, developer containers) that must not fill /run, which is RAM.
    work_cache = Under("/var/cache/nvidia-driver")
    mellanox_ready = Under("/run/mellanox/drivers/.driver-ready")
    ofa_kernel = Under(OFA_KERNEL)
    drivers = Under("/drivers")
    modprobe_d = Under("/etc/modprobe.d")
    # The precompiled image adds exactly this directory on top of the build image.
    precompiled = Under("/opt/nvidia/precompiled")

    @property
    def host_imex_nodes(self) -> Path:
        """The node's IMEX domain (NVIDIA's IMEX_NODE_CONFIG_FILE default), seen via hostPID."""
        return self.host_filesystem / "etc/nvidia-imex/nodes_config.cfg"

    def image_firmware(self, driver_version: str) -> Path:
        return self(f"{IMAGE_FIRMWARE_DIR}/{driver_version}")

    def firmware(self, driver_version: str) -> Path:
        return self(f"{FIRMWARE_DIR}/{driver_version}")

    def lib_modules(self, kernel_release: str) -> Path:
        return self(f"/lib/modules/{kernel_release}")

    def driver_sources(self, driver_version: str) -> Path:
        return self(f"/usr/src/nvidia-{driver_version}")

    def host_kernel_tree(self, kernel_release: str) -> Path:
        return self.host_filesystem / "usr/lib/modules" / kernel_release / "build"
