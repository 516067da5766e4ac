"""GPUDirect RDMA: nvidia-peermem built against MOFED, or DMA-BUF; and the peermem sidecar.

nvidia-peermem only works against MOFED's peer-memory symbols: built without them, its init
returns -EINVAL (NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-peermem). NVIDIA's driver
container links ``/run/mellanox/drivers/usr/src/ofa_kernel`` (the network operator's MOFED
container) into /usr/src before nvidia-installer compiles (ubuntu24.04/nvidia-driver,
``_link_ofa_kernel``); the module's Kbuild then takes MOFED's headers and Module.symvers from
the first of ``ofa_kernel/<arch>/<kernel>``, ``ofa_kernel/<kernel>``, ``ofa_kernel/default``
(nvidia-peermem.Kbuild, OFA_CANDIDATES). Here that tree is handed to the node's own build.

There is no MOFED driver container for Flatcar (Mellanox/network-operator#1546). Without the
tree, nvidia-peermem is neither loaded by ``init`` nor by the sidecar: one line points to
DMA-BUF (open kernel modules with the kernel's inbox RDMA drivers), and both carry on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.atomic import write_atomically
from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import CaughtSignalError, DriverError
from nvidia_driver.log import error, say
from nvidia_driver.naming import MACHINE
from nvidia_driver.node.host import HostFacts, is_loaded, running_release
from nvidia_driver.node.modparams import options_line, read_params
from nvidia_driver.node.signals import signals_raise, wait_for_signal
from nvidia_driver.paths import OFA_KERNEL, Paths

POLL_SECONDS = 10.0
PEERMEM = "nvidia-peermem"
DMA_BUF = (
    "use DMA-BUF instead (the open kernel modules with the kernel's inbox RDMA drivers), or "
    "deploy the network operator's MOFED driver container"
)


@dataclass(frozen=True)
class RdmaPlan:
    """What GPUDirect RDMA gets on this node: nvidia-peermem built against ``ofa_tree``."""

    load_peermem: bool
    ofa_tree: Path | None = None  # MOFED's tree for this kernel
    reason: str = ""  # one line, when nvidia-peermem is not loaded although RDMA is asked for


def ofa_tree(paths: Paths, kernel_release: str, arch: str) -> Path | None:
    """MOFED's kernel tree for this kernel, as nvidia-peermem's Kbuild would choose it (its
    OFA_ARCH directories are named as uname -m names the architecture)."""
    base = paths.ofa_kernel
    for candidate in (base / MACHINE.get(arch, arch) / kernel_release, base / kernel_release,
                      base / "default"):  # fmt: skip
        # A link into the MOFED container's own filesystem (default -> /etc/alternatives/...)
        # means nothing here; only a real directory with MOFED's symbols is a tree.
        real = candidate.is_dir() and not candidate.is_symlink()
        if real and (candidate / "Module.symvers").is_file():
            return candidate
    return None


def no_mofed_reason(paths: Paths, kernel_release: str) -> str:
    if not paths.ofa_kernel.is_dir():
        where = f"{OFA_KERNEL} is absent (no MOFED driver container; there is none for Flatcar)"
    else:
        where = f"{OFA_KERNEL} has no tree with Module.symvers for kernel {kernel_release}"
    return (
        f"GPUDirect RDMA is enabled, but {where}: not loading nvidia-peermem, which needs "
        f"MOFED's peer-memory symbols; {DMA_BUF}"
    )


def rdma_plan(paths: Paths, config: DriverConfig, facts: HostFacts) -> RdmaPlan:
    if not config.gpu_direct_rdma:
        return RdmaPlan(load_peermem=False)
    if not facts.mellanox_present:
        return RdmaPlan(
            load_peermem=False,
            reason="GPUDirect RDMA is enabled, but no Mellanox device was found: not loading "
            "nvidia-peermem",
        )
    tree = ofa_tree(paths, facts.kernel_release, config.target_arch)
    if tree is None:
        return RdmaPlan(load_peermem=False, reason=no_mofed_reason(paths, facts.kernel_release))
    return RdmaPlan(load_peermem=True, ofa_tree=tree)


# --- the nvidia-peermem-ctr sidecar ------------------------------------------------------------


def _ready(paths: Paths, config: DriverConfig) -> bool:
    if config.use_host_mofed:
        mofed_ready = is_loaded(paths, "mlx5_core")
    else:
        mofed_ready = paths.mellanox_ready.exists()
    return mofed_ready and paths.driver_ctr_ready.exists()


def _kernel_release(paths: Paths) -> str:
    try:
        return running_release(paths)
    except DriverError:
        return ""  # the sidecar waits on; it never crash-loops


def _load(paths: Paths, commands: Commands) -> None:
    """Load nvidia-peermem from the driver root, its parameters as an options line."""
    params = read_params(paths, PEERMEM)  # every token checked (safetext.py)
    if params:
        # A unique temporary name: the driver root is shared through /run/nvidia.
        conf = paths.driver_root / "etc/modprobe.d" / f"{PEERMEM}.conf"
        write_atomically(conf, options_line(PEERMEM, params))
    # No argument comes from the node's configuration: the module name only.
    result = commands.run("chroot", paths.driver_root, "modprobe", PEERMEM, check=False)
    if result.returncode != 0:
        raise DriverError(f"failed to load nvidia-peermem: {result.stderr.strip() or 'no output'}")


def reload_nvidia_peermem(
    paths: Paths,
    commands: Commands,
    config: DriverConfig,
    sleep: Callable[[float], None] = time.sleep,
    wait: Callable[[], None] | None = None,
) -> int:
    """Load nvidia-peermem once MOFED and the driver are ready; never exit on its own.

    The kubelet restarts a container that exits: a failure is logged in one line and the
    sidecar waits, so it never crash-loops; the probe reports the module's state.
    """
    try:
        with signals_raise():
            while not _ready(paths, config):
                say("waiting for mellanox ofed and nvidia drivers to be installed")
                sleep(POLL_SECONDS)
            kernel = _kernel_release(paths)
            if ofa_tree(paths, kernel, config.target_arch) is None:
                say(no_mofed_reason(paths, kernel))
            elif is_loaded(paths, "nvidia_peermem"):
                say("nvidia-peermem module already loaded, skipping modprobe")
            else:
                try:
                    _load(paths, commands)
                except DriverError as exc:
                    error(f"{exc}; waiting for a signal (the startup probe reports it)")
                else:
                    say("successfully loaded nvidia-peermem module, now waiting for signal")
            (wait or wait_for_signal)()
    except CaughtSignalError:
        say("Caught signal")
    return 0


def probe_nvidia_peermem(paths: Paths, config: DriverConfig | None = None) -> int:
    if not is_loaded(paths, "mlx5_core"):
        say("MOFED drivers are not ready, skipping probe to avoid container restarts...")
        return 0
    arch = config.target_arch if config is not None else "amd64"
    kernel = _kernel_release(paths)
    if ofa_tree(paths, kernel, arch) is None:
        say(no_mofed_reason(paths, kernel))
        return 0
    if not is_loaded(paths, "nvidia_peermem"):
        say("nvidia-peermem module is not loaded")
        return 1
    return 0
