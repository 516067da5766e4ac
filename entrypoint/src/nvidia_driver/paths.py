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

    @property
    def host_os_release(self) -> Path:
        return self("/host-etc/os-release")

    @property
    def host_filesystem(self) -> Path:
        # With hostPID, PID 1's root is the host's /.
        return self("/proc/1/root")

    @property
    def proc_version(self) -> Path:
        return self("/proc/version")

    @property
    def kernel_osrelease(self) -> Path:
        # uname -r is not namespaced; this file is the same fact, readable under the root.
        return self("/proc/sys/kernel/osrelease")

    @property
    def mounts(self) -> Path:
        return self("/proc/mounts")

    @property
    def pci_devices(self) -> Path:
        return self("/sys/bus/pci/devices")

    @property
    def nvswitch_devices(self) -> Path:
        return self("/proc/driver/nvidia-nvswitch/devices")

    @property
    def infiniband(self) -> Path:
        return self("/sys/class/infiniband")

    @property
    def lockdown(self) -> Path:
        return self("/sys/kernel/security/lockdown")

    @property
    def selinux_enforce(self) -> Path:
        return self("/sys/fs/selinux/enforce")

    @property
    def sys_module(self) -> Path:
        return self("/sys/module")

    @property
    def firmware_search_path(self) -> Path:
        return self("/sys/module/firmware_class/parameters/path")

    @property
    def run_nvidia(self) -> Path:
        return self("/run/nvidia")

    @property
    def pid_file(self) -> Path:
        return self("/run/nvidia/nvidia-driver.pid")

    @property
    def state_file(self) -> Path:
        return self("/run/nvidia/nvidia-driver.state")

    @property
    def validations(self) -> Path:
        return self("/run/nvidia/validations")

    @property
    def daemons_status(self) -> Path:
        return self("/run/nvidia/validations/.driver-daemons-status")

    @property
    def driver_ctr_ready(self) -> Path:
        return self("/run/nvidia/validations/.driver-ctr-ready")

    @property
    def driver_root(self) -> Path:
        return self(DRIVER_ROOT)

    @property
    def build_cache(self) -> Path:
        # Under /run/nvidia (a hostPath) so that a restarted pod finds what it built before.
        return self("/run/nvidia/cache")

    @property
    def work_cache(self) -> Path:
        # In the container's own writable layer, on the node's disk: large transient material
        # (kernel trees, developer containers) that must not fill /run, which is RAM.
        return self("/var/cache/nvidia-driver")

    @property
    def mellanox_ready(self) -> Path:
        return self("/run/mellanox/drivers/.driver-ready")

    @property
    def ofa_kernel(self) -> Path:
        return self(OFA_KERNEL)

    @property
    def host_imex_nodes(self) -> Path:
        """The node's IMEX domain (NVIDIA's IMEX_NODE_CONFIG_FILE default), seen via hostPID."""
        return self.host_filesystem / "etc/nvidia-imex/nodes_config.cfg"

    @property
    def drivers(self) -> Path:
        return self("/drivers")

    @property
    def modprobe_d(self) -> Path:
        return self("/etc/modprobe.d")

    @property
    def precompiled(self) -> Path:
        # The precompiled image adds exactly this directory on top of the build image.
        return self("/opt/nvidia/precompiled")

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
