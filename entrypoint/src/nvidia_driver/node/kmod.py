"""Loading and unloading the NVIDIA kernel modules."""

from __future__ import annotations

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say
from nvidia_driver.node.host import is_loaded, module_refcounts
from nvidia_driver.paths import Paths

LOAD_ORDER = ("nvidia", "nvidia-uvm", "nvidia-modeset")
PEERMEM = "nvidia-peermem"
# The driver's modules: what its packages hold and /drivers may set parameters for.
MODULES = (*LOAD_ORDER, PEERMEM)
# Modules that hold a reference on nvidia.ko; unloaded before it.
DEPENDENTS = ("nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia_drm")
BUSY_MESSAGE = "Could not unload NVIDIA driver kernel modules, driver is in use"
# Modules nvidia.ko may use; loaded from the host's own module tree (hostPID).
HOST_PREREQUISITES = ("i2c_core", "ipmi_msghandler", "ipmi_devintf")


def load_host_prerequisites(paths: Paths, commands: Commands) -> None:
    say("Loading ipmi and i2c_core kernel modules...")
    # Built into some kernels, absent from others: a failure here is not fatal.
    commands.run("modprobe", "-d", paths.host_filesystem, "-a", *HOST_PREREQUISITES, check=False)


def load_modules(commands: Commands, with_peermem: bool) -> list[str]:
    say("Loading NVIDIA driver kernel modules...")
    loaded = []
    for module in LOAD_ORDER:
        commands.run("modprobe", module)
        loaded.append(module)
    if with_peermem:
        say("Loading NVIDIA Peer Memory kernel module...")
        commands.run("modprobe", PEERMEM)
        loaded.append(PEERMEM)
    return loaded


def nvidia_in_use(paths: Paths) -> bool:
    counts = module_refcounts(paths)
    if "nvidia" not in counts:
        return False
    present = [module for module in DEPENDENTS if module in counts]
    return counts["nvidia"] > len(present) or any(counts[module] > 0 for module in present)


def describe_modules(counts: dict[str, int]) -> str:
    """The loaded NVIDIA modules with their reference counts."""
    return ", ".join(
        f"{name} (refcnt {count})" for name, count in counts.items() if name.startswith("nvidia")
    )


def unload_modules(paths: Paths, commands: Commands) -> None:
    """Unload every NVIDIA module; refuse, leaving them loaded, while any is in use."""
    if not is_loaded(paths, "nvidia"):
        return
    say("Unloading NVIDIA driver kernel modules...")
    if nvidia_in_use(paths):
        say(describe_modules(module_refcounts(paths)))
        raise DriverError(BUSY_MESSAGE)
    present = [module for module in (*DEPENDENTS, "nvidia") if is_loaded(paths, module)]
    commands.run("rmmod", *present)
